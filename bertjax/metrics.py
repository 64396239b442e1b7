"""Metric values that add up on device and are computed only on report (Mean, Sum, AUC); the
jsonl/TensorBoard/console writer.

A step returns a flat dict name -> metric; dicts of several steps or eval batches add up leaf by leaf
(`sum_metrics`), and `finalize` turns each into a float the way its type says.
"""

import json
import os
import sys

import flax
import jax
import numpy as np


@flax.struct.dataclass
class Mean:
  """A weighted mean carried as (total, count): a loss summed over its targets and their number, an
  accuracy as correct and scored, a norm with count 1 (Flax's `denominator` idea)."""

  total: jax.Array
  count: jax.Array

  def compute(self) -> float:
    return float(np.asarray(self.total) / max(float(np.asarray(self.count)), 1e-12))


@flax.struct.dataclass
class Sum:
  """A count over the reported window (e.g. skipped steps), not divided by anything."""

  value: jax.Array

  def compute(self) -> float:
    return float(np.asarray(self.value))


@flax.struct.dataclass
class AUC:
  """ROC AUC from histograms of the scores of positives and negatives (per probability bin), which add
  up over batches; ties within a bin count half."""

  positives: jax.Array
  negatives: jax.Array

  def compute(self) -> float:
    pos, neg = np.asarray(self.positives, np.float64), np.asarray(self.negatives, np.float64)
    if pos.sum() == 0 or neg.sum() == 0:
      return float("nan")
    neg_below = np.cumsum(neg) - neg
    return float((pos * (neg_below + 0.5 * neg)).sum() / (pos.sum() * neg.sum()))


def sum_metrics(a: dict, b: dict) -> dict:
  return jax.tree.map(lambda x, y: x + y, a, b)


def finalize(metrics: dict) -> dict:
  """name -> float, each metric computed as its type says."""
  return {name: metric.compute() for name, metric in metrics.items()}


def _fmt_time(seconds: float) -> str:
  seconds = int(seconds)
  return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m" if seconds >= 3600 else f"{seconds // 60}m{seconds % 60:02d}s"


class MetricWriter:
  """Writes `workdir/metrics.jsonl` (one object per write: step first), TensorBoard events and a
  progress line; does nothing on processes other than 0."""

  def __init__(self, workdir: str, enabled: bool = True):
    self.enabled = enabled
    if enabled:
      from tensorboardX import SummaryWriter

      self._jsonl = open(os.path.join(workdir, "metrics.jsonl"), "a")
      self._tb = SummaryWriter(workdir)

  def info(self, message: str):
    if self.enabled:
      print(message, flush=True)

  def write(self, step: int, values: dict):
    if not self.enabled:
      return
    self._jsonl.write(json.dumps({"step": int(step), **{k: float(v) for k, v in values.items()}}) + "\n")
    self._jsonl.flush()
    for k, v in values.items():
      self._tb.add_scalar(k, v, step)
    self._tb.flush()
    evals = {k: v for k, v in values.items() if k.startswith("eval/")}
    if evals:
      print(f"eval @ {step}: " + ", ".join(f"{k[5:]} {v:.4f}" for k, v in sorted(evals.items())), flush=True)

  def progress(self, step: int, total: int, values: dict, elapsed: float, steps_done: int):
    if not self.enabled:
      return
    eta = elapsed / max(steps_done, 1) * (total - step)
    shown = [f"{k[6:]} {v:.4f}" for k, v in values.items() if k in ("train/loss", "train/mlm_accuracy")]
    print(f"step {step}/{total} | " + " | ".join(shown) + f" | {values['tokens_per_sec']:.0f} tok/s"
          f" | elapsed {_fmt_time(elapsed)} | ETA {_fmt_time(eta)}", file=sys.stdout, flush=True)

  def close(self):
    if self.enabled:
      self._jsonl.close()
      self._tb.close()
