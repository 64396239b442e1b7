"""Metric pairs (sum, count) added up on device and divided on report; the jsonl/TensorBoard/console writer."""

import json
import os
import sys

import jax
import numpy as np

from bertjax.objectives.rtd import auc_from_histograms


def sum_metrics(a: dict, b: dict) -> dict:
  return jax.tree.map(lambda x, y: x + y, a, b)


def finalize(metrics: dict) -> dict:
  """name -> float: sum / count, or an AUC from score histograms for names ending in `auc`."""
  out = {}
  for name, (num, den) in metrics.items():
    if name.endswith("auc"):
      out[name] = auc_from_histograms(num, den)
    else:
      out[name] = float(np.asarray(num) / max(float(np.asarray(den)), 1e-12))
  return out


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
