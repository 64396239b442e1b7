"""Pretraining methods at equal compute (issue #50): each method pretrained for the same training FLOPs on the same
text with one tokenizer, then fine-tuned with one recipe on SST-2, RTE, WikiANN NER and SQuAD (v1.1 on the shared
half of the v2.0 dev set, split by article), seeds paired; one table.

  python benchmarks/equal_compute.py                      # BERT, RoBERTa, ELECTRA, SpanBERT, ModernBERT on the CPU
  python benchmarks/equal_compute.py --methods=bert,electra --tasks=sst2,rte --seeds=5 --json=/tmp/eq.json
  python benchmarks/equal_compute.py --methods=xlnet,ernie,lite   # the optional extra methods
  python benchmarks/equal_compute.py --scale=accelerator --workdir=/data/eq   # the same recipe, larger, on a GPU/TPU

Compute: a method trains `budget / (its analytic training FLOPs per step)` steps (bertjax.model.flops, what
`python -m bertjax.summary` prints: 3 x the forward matmuls of the whole pretraining model, ELECTRA's generator and
every head included, on batch x seq_len positions), so a method whose step costs more gets fewer steps.
Model: every method at the scale's size (SCALES: layers x hidden, heads of 64, seq_len, batch, vocabulary), its
feed-forward 4 x hidden except where the method's own design differs (ModernBERT's GeGLU at 8H/3, so its parameters
match the MLP's; the Lite Transformer's FFN at H, as its paper), ELECTRA's generator at 1/4 width (ELECTRA-Small's).
Every method pretrains at one peak rate (--lr, default PRETRAIN_LR: ELECTRA-Small's 5e-4; 0: each recipe's own) and
otherwise keeps its own CPU recipe (the `tiny` variant of its config: objectives, masking, data format, optimizer,
schedule, dropout), as METHODS lists.
Data: the first `mb` MB (whole documents) of wiki-00.txt and books-00.txt from --data_dir/pretrain (one paragraph
a line, split into sentences); one SentencePiece vocabulary trained once on its training documents
(bertjax.data.prepare_lib.prepare_tokenizer); each method's rows (NSP pairs, full sentences, ELECTRA's segments,
single segments, packed rows, XLNet's streams) prepared once per format with that tokenizer (the held-out documents
are the same for every format). Each pretraining run is `python -m bertjax.train` (the command is printed).
Fine-tuning: bertjax.finetune.train (what `python -m bertjax.finetune` runs) from each pretraining workdir, one
recipe for every method and task (RECIPE: AdamW at ELECTRA's small-model rate, 10% warmup, linear decay, dropout
0.1), each family's own task head, seeds 0..n-1 paired across methods (the same rows, order and subsets).
Resumable: WORKDIR/pretrain/METHOD.json and WORKDIR/finetune/METHOD/TASK/seed_S.json mark finished pieces, which
a rerun skips (an interrupted pretraining resumes from its checkpoint). The table: method, pretraining FLOPs,
steps and wall time, the eval figure (MLM loss and accuracy; ELECTRA: RTD AUC; XLNet: PLM), and each task's median
dev score over the seeds (accuracy; entity F1; SQuAD F1).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
import zlib

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(1, os.path.join(REPO, "benchmarks"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

DATA = os.path.join(os.path.dirname(REPO), "shared", "data")  # beside the checkout, as the other benchmarks read it
if not os.path.isdir(DATA):
  DATA = "/work/shared/data"

ALL_TEXT = tuple(f"wiki-0{i}.txt" for i in range(3)) + tuple(f"books-0{i}.txt" for i in range(5))  # 95 MB

# Sizes of a scale: the encoder (layers, hidden; heads of 64), rows, vocabulary, the FLOPs budget, the text (the
# first `mb` MB of each of `files`, default wiki-00 and books-00, and the share of its documents held out for the eval
# figure), and the fine-tuning rows (train, eval; 0: all) and epochs per task. `cpu` fits a 2-core machine in about
# 30 minutes a method (docs/benchmarks.md: how it was sized); `accelerator` is the same recipe at ELECTRA-Small's
# depth and width on all the text; `micro` is a smoke test (a few steps of a 2 x 64 encoder; the slow test).
SCALES = {
    "micro": dict(layers=2, hidden=64, seq_len=64, batch=8, vocab=1000, dtype="float32", budget=2e9, mb=0.1,
                  eval_fraction=0.1, tasks=dict(sst2=(200, 100, 1.0), rte=(100, 100, 1.0), wikiann=(100, 100, 1.0),
                                                squad=(100, 50, 1.0))),
    "cpu": dict(layers=4, hidden=256, seq_len=128, batch=32, vocab=8000, dtype="float32", budget=8e13, mb=8.0,
                eval_fraction=0.02, tasks=dict(sst2=(2000, 0, 2.0), rte=(0, 0, 1.0), wikiann=(2000, 1000, 2.0),
                                               squad=(500, 300, 1.0))),
    "accelerator": dict(layers=12, hidden=256, seq_len=128, batch=128, vocab=16000, dtype="bfloat16", budget=1e16,
                        mb=25.0, files=ALL_TEXT, eval_fraction=0.01,
                        tasks=dict(sst2=(0, 0, 3.0), rte=(0, 0, 10.0), wikiann=(0, 0, 3.0), squad=(0, 0, 2.0))),
}

# name: (config preset, its overrides at the scale's sizes). Every method starts from its family's CPU recipe.
METHODS = {
    "bert": ("configs/bert.py:tiny", {}),  # MLM + NSP on sentence pairs
    "roberta": ("configs/roberta.py:tiny", {}),  # MLM on FULL-SENTENCES rows, no NSP
    # ELECTRA-Small's embeddings are half its width; here they are the hidden width as every other method's.
    "electra": ("configs/electra.py:tiny", {"model.embedding_size": 0}),
    "spanbert": ("configs/spanbert.py:tiny", {}),  # span masking, MLM + SBO, single segments
    "modernbert": ("configs/modernbert.py:tiny", {}),  # packed rows, 30% masking, StableAdamW, WSD
    # Optional extras.
    "xlnet": ("configs/xlnet.py:tiny", {"model.xlnet.bi_data": False}),  # permutation LM on token streams
    # ERNIE's whole-entity masking: WikiANN's training mentions mark the entities in the text (a gazetteer).
    "ernie": ("configs/ernie.py:tiny", {"data.format": "full_sentences"}),
    "lite": ("configs/lite.py:tiny", {"model.lsra_kernel_sizes": ""}),  # LSRA; the reference's kernels by layer
}
DEFAULT_METHODS = "bert,roberta,electra,spanbert,modernbert"

# task: (fine-tuning preset, the metric reported, the data under --data_dir). seq_len: the encoder's rows.
TASKS = {
    "sst2": ("sst2", "accuracy", "glue/SST-2"),
    "rte": ("rte", "accuracy", "glue/RTE"),
    "wikiann": ("ner", "f1", "ner/wikiann-en"),
    "squad": ("squad1", "f1", "squad/dev-v2.0-half.json"),
}
# One pretraining rate for every method (--lr): ELECTRA-Small's (configs/electra.py; the paper's BERT-Small
# baseline is trained with ELECTRA-Small's hyperparameters), so that the objective and data, not the rate, differ.
# Each method's tiny recipe has its own (2e-3 for most, tiny_on_demo's, sized for 2 layers x 128 on a 100k-token
# corpus), at which BERT at this scale stayed at the unigram plateau for all its 870 steps (docs/results.md).
PRETRAIN_LR = 5e-4
# One fine-tuning recipe for every method and task. lr 3e-4: ELECTRA's small-model rate (paper Appendix, Table 7:
# ELECTRA-Small and its BERT-Small baseline fine-tuned at 3e-4); batch 32, 10% warmup then linear decay, weight decay
# 0.01, dropout 0.1, Adam eps 1e-6 with bias correction (transformers' AdamW), epochs per task from the scale.
RECIPE = {"batch_size": 32, "learning_rate": 3e-4, "warmup_steps": -1, "warmup_fraction": 0.1,
          "epoch_mode": "transformers", "optimizer.schedule": "linear_after_warmup", "optimizer.eps": 1e-6,
          "optimizer.weight_decay": 0.01, "optimizer.bias_correction": True, "optimizer.layerwise_decay": 1.0,
          "model.dropout": 0.1, "model.attention_dropout": 0.1, "model.classifier_dropout": 0.1, "log_every": 10_000}
SQUAD = dict(train_articles=12, eval_articles=4, doc_stride=64, max_query_length=32)  # qa_parity's split


def set_key(config, dotted: str, value):
  """config[a][b][c] = value for 'a.b.c' (what --config.a.b.c=value does)."""
  *path, key = dotted.split(".")
  for p in path:
    config = config[p]
  config[key] = value


def flag(dotted: str, value) -> str:
  return f"--config.{dotted}={value!r}" if isinstance(value, float) else f"--config.{dotted}={value}"


def method_overrides(name: str, scale: dict, text: str, tokenizer: str, args) -> dict:
  """The keys a method's run sets on its preset: the scale's sizes and data, then METHODS' own."""
  h = scale["hidden"]
  o = {"model.num_layers": scale["layers"], "model.hidden_size": h, "model.num_heads": max(1, h // 64),
       "model.intermediate_size": 4 * h, "model.vocab_size": scale["vocab"], "model.dtype": scale["dtype"],
       "batch_size": scale["batch"], "seq_len": scale["seq_len"], "seed": 0,
       "data.source": text, "data.split_paragraphs": True, "data.tokenizer": tokenizer, "data.dupe_factor": 1,
       "data.eval_fraction": scale["eval_fraction"]}
  if name == "modernbert":  # GeGLU: each of its two halves 8H/3 wide (rounded to 32), the MLP's parameters
    o["model.intermediate_size"] = max(32, round(8 * h / 3 / 32) * 32)
  if name == "lite":  # the Lite Transformer's FFN is as wide as the model (configs/lite.py's variants)
    o["model.intermediate_size"] = h
  if name == "xlnet":  # streams of seq_len windows, half of each continuing the previous one (tiny's ratios)
    s = scale["seq_len"]
    o.update({"model.xlnet.reuse_len": s // 2, "model.xlnet.mem_len": 3 * s // 4, "data.perm_size": s // 2,
              "data.num_predict": s // 6, "masking.max_predictions": s // 6,
              "eval_batch_size": max(1, scale["batch"] // 4)})  # eval streams: fewer, so a short eval text has enough
  if name == "ernie":
    o["data.units"] = f"conll:{os.path.join(args.data_dir, 'ner', 'wikiann-en', 'train')}"
  if args.lr:
    o["learning_rate"] = args.lr
  o.update(METHODS[name][1])
  return o


def load_config(preset: str, overrides: dict):
  from bertjax.core import config as config_lib

  path, _, arg = preset.partition(":")
  c = config_lib.load(f"{os.path.join(REPO, path)}:{arg}")
  for k, v in overrides.items():
    set_key(c, k, v)
  return c


def step_flops(config) -> tuple[float, float, int]:
  """(training FLOPs per token, per step, parameters) of a config, as bertjax.summary counts them."""
  from bertjax.core import config as config_lib
  from bertjax.model import flops
  from bertjax.objectives import masking
  from bertjax.train import build

  import jax

  build.validate(config)
  model = build.make_model(config)
  fpt = flops.model_train_flops_per_token(model, config.seq_len, config_lib.max_predictions(config),
                                          masking.shuffle_slots(config.seq_len, config.masking.wso_share))
  params = sum(x.size for x in jax.tree.leaves(build.param_shapes(config)))
  return fpt, fpt * config.batch_size * config.seq_len, params


def shared_tokenizer(config, work: str) -> str:
  """spm:PATH of the one SentencePiece vocabulary, trained once on the text's training documents."""
  from bertjax.data import prepare_lib, trees

  key = zlib.crc32(f"{config.data.source} {config.data.tokenizer_model} {config.model.vocab_size}".encode())
  directory = os.path.join(work, f"tokenizer-{key:08x}")  # another text or size: another vocabulary
  path = os.path.join(directory, "tokenizer.model")
  if not os.path.isfile(path):
    os.makedirs(directory, exist_ok=True)
    c = config.copy_and_resolve_references()
    c.data.tokenizer = ""
    t0 = time.time()
    prepare_lib.prepare_tokenizer(c, trees.open_reader(c), directory)
    print(f"tokenizer: SentencePiece {c.data.tokenizer_model}, {c.model.vocab_size} pieces, trained once on "
          f"{c.data.source} ({time.time() - t0:.0f} s)", flush=True)
  return f"spm:{path}"


def prepared_rows(config, work: str) -> str:
  """shards:DIR of the config's rows (its format and data settings), prepared once and shared by the methods
  whose rows are the same."""
  from bertjax.data import prepare_lib

  fmt = prepare_lib.resolve_format(config)
  key = zlib.crc32((config.data.to_json(sort_keys=True) + str(config.seq_len)).encode())
  out = os.path.join(work, "data", f"{fmt}-{key:08x}")
  if not os.path.isfile(os.path.join(out, "metadata.json")):
    t0 = time.time()
    meta = prepare_lib.prepare(config, out, workers=os.cpu_count() or 1, overwrite=True, progress=None)
    print(f"rows: {fmt} -> {out}: {meta['splits']['train']['rows']:,} train / {meta['splits']['eval']['rows']:,} "
          f"eval rows ({time.time() - t0:.0f} s)", flush=True)
  return f"shards:{out}"


def eval_figure(metrics: dict) -> str:
  """The method's own held-out figure: RTD AUC (ELECTRA), PLM loss (XLNet), else MLM loss and accuracy."""
  if "eval/rtd_auc" in metrics:
    return f"RTD AUC {metrics['eval/rtd_auc']:.3f}"
  for name in ("mlm", "plm"):
    if f"eval/{name}_loss" in metrics:
      acc = metrics.get(f"eval/{name}_accuracy")
      return f"{name.upper()} {metrics[f'eval/{name}_loss']:.3f}" + (f" / {acc:.3f}" if acc is not None else "")
  return "-"


def size_of(scale: dict) -> dict:
  """What a pretraining record must match to be reused: the model and rows of the scale."""
  return {k: scale[k] for k in ("layers", "hidden", "seq_len", "batch", "vocab", "dtype")}


def pretrain(name: str, args, scale: dict, text: str, tokenizer: str, env: dict) -> dict:
  """Pretrains `name` for the budget (skipped when WORK/pretrain/NAME.json exists); its record."""
  done = os.path.join(args.workdir, "pretrain", f"{name}.json")
  if os.path.isfile(done):
    with open(done) as f:
      record = json.load(f)
    if (record["budget"], record["size"], record.get("lr")) != (args.budget, size_of(scale), args.lr):
      sys.exit(f"error: {done} was trained for {record['budget']:g} FLOPs at {record['size']} and --lr="
               f"{record.get('lr', 'unrecorded')}, not {args.budget:g} at {size_of(scale)} and --lr={args.lr:g}; use "
               f"another --workdir")
    print(f"[{name}] pretraining: finished earlier ({done}), skipped", flush=True)
    return dict(record, skipped=True)
  preset = METHODS[name][0]
  overrides = method_overrides(name, scale, text, tokenizer, args)
  config = load_config(preset, overrides)
  fpt, per_step, params = step_flops(config)
  steps = max(1, int(args.budget // per_step))
  overrides["data.source"] = prepared_rows(config, args.workdir)
  overrides.update({"total_steps": steps, "log_every": max(1, steps // 10), "eval_every": steps,
                    "checkpoint_every": max(1, steps // 4), "keep_checkpoints": 1})
  run_dir = os.path.join(args.workdir, "pretrain", name)
  command = [sys.executable, "-m", "bertjax.train", f"--config={preset}", f"--workdir={run_dir}",
             *[flag(k, v) for k, v in overrides.items()]]
  print(f"[{name}] pretraining: {steps} steps x {per_step:.3g} FLOPs ({fpt / 1e6:.1f} MFLOPs/token x "
        f"{config.batch_size} x {config.seq_len}) = {steps * per_step:.3g} of the {args.budget:.3g} budget; "
        f"{params:,} parameters\n  {' '.join(command)}", flush=True)
  os.makedirs(run_dir, exist_ok=True)
  t0 = time.time()
  with open(os.path.join(args.workdir, "pretrain", f"{name}.log"), "a") as log, \
      subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) as p:
    for line in p.stdout:
      log.write(line)
      if not args.quiet:
        print(f"  | {line}", end="", flush=True)
  if p.returncode:
    raise RuntimeError(f"{name} pretraining exited {p.returncode}; see {log.name}")
  seconds = time.time() - t0
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    evals = [m for m in map(json.loads, f) if any(k.startswith("eval/") for k in m)]
  record = dict(method=name, preset=preset, overrides=overrides, budget=args.budget, size=size_of(scale), lr=args.lr,
                steps=steps, flops_per_token=fpt, flops_per_step=per_step, flops=steps * per_step, params=params,
                wall_seconds=seconds, eval=evals[-1] if evals else {}, workdir=run_dir, command=command)
  with open(done, "w") as f:
    json.dump(record, f, indent=1)
  print(f"[{name}] pretrained in {seconds / 60:.1f} min: {eval_figure(record['eval'])}", flush=True)
  return record


def task_data(task: str, args, scale: dict) -> dict:
  """The task section's source keys (and SQuAD's split by article, written once under the workdir)."""
  preset, _, path = TASKS[task]
  n_train, n_eval, _ = scale["tasks"][task]
  if task == "squad":
    import qa_parity

    out = os.path.join(args.workdir, f"squad-{n_train}-{n_eval}")
    if not os.path.isfile(os.path.join(out, "v1", "dev-v1.1.json")):
      split = argparse.Namespace(train_questions=n_train, eval_questions=n_eval, **{
          k: SQUAD[k] for k in ("train_articles", "eval_articles")})
      qa_parity.split(split, out, os.path.join(args.data_dir, path))
    return {"task.source": f"json:{os.path.join(out, 'v1')}", "task.doc_stride": SQUAD["doc_stride"],
            "task.max_query_length": SQUAD["max_query_length"]}
  source = os.path.join(args.data_dir, path)
  o = {"task.max_train_examples": n_train, "task.max_eval_examples": n_eval}
  if task == "wikiann":  # WikiANN's files: train, dev; every token prefixed en:
    return dict(o, **{"task.source": f"conll:{source}", "task.train_file": "train", "task.eval_file": "dev",
                      "task.strip_token_prefix": "en:"})
  return dict(o, **{"task.source": f"tsv:{source}"})


def finetune(name: str, task: str, record: dict, args, scale: dict) -> list:
  """Fine-tunes `name`'s pretrained model on `task` once per seed (a seed skipped when its JSON holds this plan)."""
  out = os.path.join(args.workdir, "finetune", name, task)
  files = {s: os.path.join(out, f"seed_{s}.json") for s in range(args.seeds)}
  # A finished seed is reused only under the same rows, epochs, length and recipe.
  plan = dict(rows=list(scale["tasks"][task]), seq_len=scale["seq_len"], recipe=RECIPE)
  results, todo = {}, []
  for s, path in files.items():
    with open(path) if os.path.isfile(path) else open(os.devnull) as f:
      done = json.loads(f.read() or "{}")
    if done.get("plan") == plan:
      results[s] = dict(done, skipped=True)
    else:
      todo.append(s)
  if not todo:
    print(f"[{name}] {task}: seeds {sorted(results)} finished earlier, skipped", flush=True)
    return [results[s] for s in sorted(results)]
  from bertjax.core import config as config_lib
  from bertjax.finetune import train

  preset, metric, _ = TASKS[task]
  c = config_lib.load(os.path.join(REPO, f"configs/finetune.py:{preset}"))
  keys = dict(RECIPE, **task_data(task, args, scale), seed=0, seeds=1, seq_len=scale["seq_len"],
              epochs=scale["tasks"][task][2], bucket_lengths=args.buckets, **{"init.checkpoint": record["workdir"]})
  for k, v in keys.items():
    set_key(c, k, v)
  train.validate(c)
  t0 = time.time()
  setup = train.prepare(c)
  info = setup["info"]
  print(f"[{name}] {task}: {info['train_examples']} train / {info['eval_examples']} eval examples, {setup['total']} "
        f"steps x {c.batch_size}, {c.epochs:g} epochs, seeds {todo} ({time.time() - t0:.0f} s to prepare)", flush=True)
  for s in todo:
    t1 = time.time()
    metrics = train.run_seed(c, s, setup, out)
    results[s] = dict(metrics=metrics, score=metrics[metric], metric=metric, seed=s, steps=setup["total"],
                      train_examples=info["train_examples"], eval_examples=info["eval_examples"],
                      epochs=c.epochs, seconds=time.time() - t1, plan=plan)
    with open(files[s], "w") as f:
      json.dump(results[s], f, indent=1)
    print(f"[{name}] {task} seed {s}: {metric} {metrics[metric]:.4f} ({results[s]['seconds']:.0f} s)", flush=True)
  return [results[s] for s in sorted(results)]


def table(rows: dict, tasks: list, args, scale: dict) -> str:
  """The printed table: budget lines, then one row per method."""
  s = scale
  lines = [f"equal compute: {args.budget:.3g} training FLOPs per method (bertjax.model.flops); encoder {s['layers']} "
           f"layers x {s['hidden']} ({max(1, s['hidden'] // 64)} heads), rows of {s['seq_len']}, batch {s['batch']}, "
           f"one SentencePiece vocabulary of {s['vocab']}; pretraining lr "
           f"{f'{args.lr:g} for every method' if args.lr else 'each method its own'}; text: the first {s['mb']:g} MB of "
           f"each of "
           f"{', '.join(s.get('files', ('wiki-00.txt', 'books-00.txt')))}",
           f"fine-tuning: lr {RECIPE['learning_rate']:g}, batch {RECIPE['batch_size']}, seq {s['seq_len']}, seeds "
           f"0..{args.seeds - 1} paired, median dev score; " + "; ".join(
               f"{t} {s['tasks'][t][0] or 'all'} train / {s['tasks'][t][1] or 'all'} dev x {s['tasks'][t][2]:g} epochs"
               for t in tasks) + (" (SQuAD: v1.1 questions, by article)" if "squad" in tasks else ""),
           f"{os.cpu_count()} cores, scale {args.scale}", ""]
  head = f"{'method':<11} {'params':>10} {'steps':>6} {'FLOPs':>8} {'minutes':>7}  {'eval':<20}" + "".join(
      f" {t + ' ' + TASKS[t][1][:3]:>12}" for t in tasks)
  lines += [head, "-" * len(head)]
  for name, r in rows.items():
    p = r.get("pretrain")
    if not p or "error" in p:
      lines.append(f"{name:<11} error: {(p or {}).get('error', 'not run')}")
      continue
    cells = []
    for t in tasks:
      ft = r["tasks"].get(t, {})
      cells.append(f"{ft['median']:>12.4f}" if "median" in ft else f" {'error' if 'error' in ft else '-':>11}")
    lines.append(f"{name:<11} {p['params']:>10,} {p['steps']:>6} {p['flops']:>8.2e} {p['wall_seconds'] / 60:>7.1f}  "
                 f"{eval_figure(p['eval']):<20}" + "".join(f" {c}" for c in cells))
  return "\n".join(lines)


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--methods", default=DEFAULT_METHODS, help=f"of {', '.join(METHODS)}")
  p.add_argument("--tasks", default=",".join(TASKS), help=f"of {', '.join(TASKS)}")
  p.add_argument("--seeds", type=int, default=3, help="fine-tuning seeds 0..N-1, the same for every method")
  p.add_argument("--scale", default="cpu", choices=sorted(SCALES))
  p.add_argument("--budget", type=float, default=0.0, help="training FLOPs per method (0: the scale's)")
  p.add_argument("--mb", type=float, default=0.0, help="MB of text from each of wiki-00 and books-00 (0: the scale's)")
  p.add_argument("--train_rows", type=int, default=-1,
                 help="fine-tuning rows (SQuAD: questions) per task, all tasks (-1: the scale's; 0: all)")
  p.add_argument("--eval_rows", type=int, default=-1, help="dev rows per task, all tasks (-1: the scale's; 0: all)")
  p.add_argument("--buckets", default="auto", help="fine-tuning length buckets (bucket_lengths; none: one compile "
                 "per task at seq_len, for micro runs whose compiles outweigh their steps)")
  p.add_argument("--lr", type=float, default=PRETRAIN_LR,
                 help="pretraining peak rate for every method (default ELECTRA-Small's; 0: each method's tiny recipe's)")
  p.add_argument("--data_dir", default=DATA, help="pretrain/, glue/, ner/, squad/ as ../shared/data lays them out")
  p.add_argument("--workdir", default="/tmp/bertjax-equal-compute")
  p.add_argument("--quiet", action="store_true", help="keep the pretraining commands' own lines in their logs only")
  p.add_argument("--json", default="", help="also write the table's data as JSON here")
  args = p.parse_args(argv)
  scale = dict(SCALES[args.scale])
  args.budget = args.budget or scale["budget"]
  scale["budget"], scale["mb"] = args.budget, args.mb or scale["mb"]
  scale["tasks"] = {t: (args.train_rows if args.train_rows >= 0 else n, args.eval_rows if args.eval_rows >= 0 else e,
                        epochs) for t, (n, e, epochs) in scale["tasks"].items()}
  methods = [m for m in args.methods.split(",") if m]
  tasks = [t for t in args.tasks.split(",") if t]
  unknown = [m for m in methods if m not in METHODS] + [t for t in tasks if t not in TASKS]
  if unknown:
    sys.exit(f"error: unknown methods or tasks {unknown}; methods: {', '.join(METHODS)}; tasks: {', '.join(TASKS)}")
  pretrain_dir = os.path.join(args.data_dir, "pretrain")
  if not all(os.path.isfile(os.path.join(pretrain_dir, f)) for f in ("wiki-00.txt", "books-00.txt")):
    sys.exit(f"error: no wiki-00.txt and books-00.txt under {pretrain_dir}; pass --data_dir (../shared/data's layout)")
  from bertjax.core import runtime

  runtime.setup()
  from continued_pretraining import text_slice  # the shared text's slice, as that benchmark takes it

  os.makedirs(os.path.join(args.workdir, "pretrain"), exist_ok=True)
  t_all = time.time()
  files = scale.get("files", ("wiki-00.txt", "books-00.txt"))
  text = text_slice(pretrain_dir, scale["mb"], os.path.join(args.workdir, f"text-{len(files)}x{scale['mb']:g}mb"),
                    files)
  tokenizer = shared_tokenizer(load_config(METHODS["bert"][0], method_overrides("bert", scale, text, "", args)),
                               args.workdir)
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  rows = {}
  for i, name in enumerate(methods, 1):
    print(f"== method {i}/{len(methods)}: {name} ({time.time() - t_all:.0f} s in)", flush=True)
    rows[name] = r = dict(tasks={})
    try:
      r["pretrain"] = pretrain(name, args, scale, text, tokenizer, env)
    except Exception as e:  # an optional method's failure is a row of the table, not the end of the run
      r["pretrain"] = dict(error=f"{type(e).__name__}: {e}")
      print(f"[{name}] pretraining failed: {r['pretrain']['error']}", flush=True)
      continue
    for task in tasks:
      try:
        seeds = finetune(name, task, r["pretrain"], args, scale)
        r["tasks"][task] = dict(median=statistics.median(x["score"] for x in seeds), seeds=seeds,
                                skipped=all(x.get("skipped") for x in seeds))
      except Exception as e:
        r["tasks"][task] = dict(error=f"{type(e).__name__}: {e}")
        print(f"[{name}] {task} failed: {r['tasks'][task]['error']}", flush=True)
  text_table = table(rows, tasks, args, scale)
  print(f"\n{text_table}\n({(time.time() - t_all) / 60:.1f} min in all)", flush=True)
  out = dict(args=vars(args), scale=scale, recipe=RECIPE, rows=rows, table=text_table)
  if args.json:
    with open(args.json, "w") as f:
      json.dump(out, f, indent=1, default=str)
  return out


if __name__ == "__main__":
  from bertjax.core import cli

  cli.script(main)
