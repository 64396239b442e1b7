"""The optimizer update alone, fused (`optim.make`'s default) against the plain optax chain (`fused=False`).

For each optimizer setting, on a BERT variant's parameter tree (random values, float32), jits what the train step
runs after the gradients (`tx.update` then `optax.apply_updates`, parameters and state donated), counts the loop
fusions XLA emits (the entry computation's kLoop fusions: each reads and writes whole arrays) and the library
reductions, and times the variants' updates in alternating rounds (every variant sees the same machine load).
With `--norm_given`, also `fused_norm_given`: the fused update handed the gradients' global norm, as the train step
hands it. Prints a table and one JSON line. Holds two or three copies of the parameters and Adam's state at once
(BERT-base: about 1.3 GB each).

  python benchmarks/optim_update.py                                  # BERT-base, every optimizer setting
  python benchmarks/optim_update.py --variant=tiny --cases=adamw,lamb --rounds=2
"""

import argparse
import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bertjax.core import config as config_lib, runtime  # noqa: E402

# name -> the optimizer section's settings over BERT's (AdamW, b1 0.9, b2 0.999, eps 1e-6, decay 0.01, clip 1.0).
CASES = {
    "adamw": dict(bias_correction=True, decay_mask="bert"),
    "adamw_all": dict(bias_correction=True, decay_mask="all"),
    "adamw_bert_rule": dict(bias_correction=False, decay_mask="bert"),
    "lamb": dict(name="lamb", bias_correction=False),
    "lamb_nvidia": dict(name="lamb", bias_correction=True),
    "stableadamw": dict(name="stableadamw", clip_norm=0.0),
}


def section(case: str):
  """The optimizer config section of a case."""
  import ml_collections

  o = ml_collections.ConfigDict(dict(name="adamw", b1=0.9, b2=0.999, eps=1e-6, weight_decay=0.01, clip_norm=1.0,
                                     bias_correction=True, decay_mask="bert", schedule="linear"))
  o.update(CASES[case])
  return o


def compiled_update(tx, params, grads, pass_norm: bool):
  """(the compiled update with donated params and state, its optimized HLO)."""
  import jax
  import optax

  def update(p, s, g):
    extra = {"global_norm": optax.tree.norm(g)} if pass_norm else {}
    u, s = tx.update(g, s, p, **extra)
    return optax.apply_updates(p, u), s

  compiled = jax.jit(update, donate_argnums=(0, 1)).lower(params, tx.init(params), grads).compile()
  return compiled, compiled.as_text()


def fusions(hlo: str) -> dict:
  """Loop fusions and library (kCustom) fusions in the entry computation."""
  entry = hlo[hlo.index("\nENTRY"):]
  return dict(loops=entry.count("kind=kLoop"), library=entry.count("kind=kCustom"))


def main():
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--variant", default="base", help="configs/bert.py variant whose parameter tree is updated")
  parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
  parser.add_argument("--rounds", type=int, default=3, help="alternating rounds")
  parser.add_argument("--steps", type=int, default=3, help="timed updates per variant and round")
  parser.add_argument("--norm_given", action="store_true", help="also time the fused update handed the norm")
  args = parser.parse_args()
  runtime.setup()
  import jax
  import jax.numpy as jnp
  import numpy as np

  from bertjax.train import build, optim

  config = config_lib.load(os.path.join(REPO, f"configs/bert.py:{args.variant}"))
  shapes = build.param_shapes(config)
  rng = np.random.default_rng(0)
  grads = jax.device_put(jax.tree.map(lambda s: rng.normal(0, 1e-3, s.shape).astype(np.float32), shapes))
  params = jax.tree.map(lambda g: g * 20.0, grads)  # BERT-like magnitudes (0.02); the values do not change the work
  variants = ("reference", "fused", "fused_norm_given") if args.norm_given else ("reference", "fused")
  leaves = len(jax.tree.leaves(shapes))
  schedule = optim.schedule("linear", 1e-4, 100, 1000)
  results = {}
  for case in args.cases.split(","):
    o, jobs = section(case), {}
    for variant in variants:
      tx = optim.make(o, schedule, fused=variant != "reference")
      compiled, hlo = compiled_update(tx, params, grads, variant == "fused_norm_given")
      state = jax.block_until_ready(compiled(jax.tree.map(jnp.copy, params), tx.init(params), grads))  # untimed
      jobs[variant] = [compiled, state, [], fusions(hlo)]
    for _ in range(args.rounds):
      for job in jobs.values():
        compiled, state, times, _ = job
        for _ in range(args.steps):
          t0 = time.perf_counter()
          state = compiled(*state, grads)
          jax.block_until_ready(state)
          times.append(time.perf_counter() - t0)
        job[1] = state
    base = statistics.median(jobs["reference"][2])
    results[case] = {v: dict(ms=1e3 * statistics.median(j[2]), ratio=statistics.median(j[2]) / base, **j[3])
                     for v, j in jobs.items()}
    del jobs, state, compiled  # before the next case's copies
    for v, r in results[case].items():
      print(f"{case:16s} {v:17s} {r['ms']:8.1f} ms  x{r['ratio']:.2f}  loop fusions {r['loops']:4d} "
            f"({r['loops'] / leaves:.1f} per leaf)  library {r['library']}", file=sys.stderr, flush=True)
  print(json.dumps(dict(variant=args.variant, leaves=leaves, load=os.getloadavg(), results=results)), flush=True)


if __name__ == "__main__":
  from bertjax.core import cli

  cli.script(main)
