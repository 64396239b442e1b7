"""Dropout masks' generators (model.dropout_rng: threefry, the reference, and lowbias32) timed side by side.

  python benchmarks/dropout_masks.py                          # masks alone, then the MiniLM fine-tuning step
  python benchmarks/dropout_masks.py --steps=0 --rounds=9     # masks alone only

1. The mask alone (`bertjax.model.dropout.keep_mask`, keep 0.9, a jitted call that returns the bool mask) and
   applied to a float32 array as `Dropout` applies it (select x / keep or 0), for the attention probabilities
   of BERT-base at batch 32 x 128 ([32, 12, 128, 128]) and a hidden state [8, 128, 768].
2. bertjax's fine-tuning step (`cpu_routing.finetune_job`: AdamW, a sentence-pair classifier, dropout 0.1 on
   the hidden states and the attention probabilities) at MiniLM's sizes (all-MiniLM-L6-v2: 6 layers, hidden
   384, 12 heads, FFN 1536), batch 32 at each --seq_lens, once per generator.
Everything runs in this one process (the same XLA flags: runtime.setup's), the generators alternating in
rounds (who goes first alternates too) so both see the same load; the load average is printed before and
after. Medians in ms (the steps' wall time, and their CPU time over all threads, `cpu`, which other jobs' load
moves less), and each generator's ratio to threefry's time. Then one JSON line.
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
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

from bertjax.core import runtime  # noqa: E402

MASK_SHAPES = {"attention 32x12x128x128": (32, 12, 128, 128), "hidden 8x128x768": (8, 128, 768)}
MINILM = {"model.hidden_size": 384, "model.num_layers": 6, "model.num_heads": 12, "model.intermediate_size": 1536}


def load() -> str:
  """The 1-, 5- and 15-minute load averages, as `uptime` prints them."""
  return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def alternate(fns: dict, rounds: int, steps: int) -> tuple[dict, dict]:
  """({name: every timed call's wall seconds}, {name: its CPU seconds, all threads}): `steps` calls of each fn
  per round, the order reversed every round. CPU time counts only this process's work, so other jobs' load
  moves it less than wall time."""
  for fn in fns.values():
    fn()  # compile and warm up
  wall, cpu = {name: [] for name in fns}, {name: [] for name in fns}
  names = list(fns)
  for r in range(rounds):
    for name in names if r % 2 == 0 else names[::-1]:
      for _ in range(steps):
        t0, c0 = time.perf_counter(), time.process_time()
        fns[name]()
        wall[name].append(time.perf_counter() - t0)
        cpu[name].append(time.process_time() - c0)
  return wall, cpu


def mask_timings(generators, rounds: int) -> dict:
  """Per shape and generator: median ms of the mask alone and of the mask applied to an array."""
  import jax
  import jax.numpy as jnp

  from bertjax.model.dropout import keep_mask

  out = {}
  for label, shape in MASK_SHAPES.items():
    x = jnp.ones(shape, jnp.float32)
    fns = {}
    for g in generators:
      alone = jax.jit(lambda key, g=g: keep_mask(key, shape, 0.9, generator=g))
      applied = jax.jit(lambda key, x, g=g: jnp.where(keep_mask(key, x.shape, 0.9, generator=g), x / 0.9, 0.0))
      key = jax.random.key(0)
      fns[f"{g} mask"] = lambda f=alone: f(key).block_until_ready()
      fns[f"{g} applied"] = lambda f=applied: f(key, x).block_until_ready()
    times, _ = alternate(fns, rounds, 3)
    out[label] = {name: 1e3 * statistics.median(t) for name, t in times.items()}
  return out


def step_timings(generators, seq_lens, rounds: int, steps: int) -> dict:
  """Per seq_len and generator: median ms of the MiniLM-sized fine-tuning step (cpu_routing.finetune_job)."""
  import cpu_routing

  out = {}
  for seq_len in seq_lens:
    fns, jobs = {}, {}
    for g in generators:
      job = cpu_routing.finetune_job("base", 32, seq_len, {**MINILM, "model.dropout_rng": g})
      jobs[g] = [job, job.state]

      def run(g=g):
        jobs[g][1] = jobs[g][0].run(jobs[g][1])
      fns[g] = run
    wall, cpu = alternate(fns, rounds, steps)
    out[f"minilm finetune 32x{seq_len}"] = {g: 1e3 * statistics.median(t) for g, t in wall.items()}
    out[f"minilm finetune 32x{seq_len} cpu"] = {g: 1e3 * statistics.median(t) for g, t in cpu.items()}
    out[f"minilm finetune 32x{seq_len}"]["compile_s"] = {g: jobs[g][0].compile_seconds for g in generators}
  return out


def report(results: dict, generators) -> str:
  """One line per shape/workload: each measurement's median ms and its ratio to threefry's."""
  lines = []
  for label, row in results.items():
    cells = []
    for name, ms in row.items():
      if name == "compile_s":
        continue
      base = row[name.replace(name.split(" ")[0], generators[0], 1)]
      cells.append(f"{name} {ms:7.1f} ms ({base / ms:4.2f}x)")
    lines.append(f"{label:<26} " + "  ".join(cells))
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--generators", default="threefry,lowbias32", help="comma-separated; the first is the reference")
  parser.add_argument("--rounds", type=int, default=4, help="rounds of alternating generators")
  parser.add_argument("--steps", type=int, default=2, help="fine-tuning steps per generator and round (0: none)")
  parser.add_argument("--seq_lens", default="64,96", help="fine-tuning step lengths (batch 32)")
  args = parser.parse_args()
  runtime.setup()
  generators = args.generators.split(",")
  print(f"load average before: {load()} ({os.cpu_count()} CPUs)", flush=True)
  results = mask_timings(generators, args.rounds)
  print(report(results, generators), flush=True)
  if args.steps:
    steps = step_timings(generators, [int(s) for s in args.seq_lens.split(",")], args.rounds, args.steps)
    print(report(steps, generators), flush=True)
    results.update(steps)
  print(f"load average after: {load()}", flush=True)
  print(json.dumps(dict(cpu_count=os.cpu_count(), load_after=os.getloadavg(), results=results)))


if __name__ == "__main__":
  from bertjax.core import cli

  cli.script(main)
