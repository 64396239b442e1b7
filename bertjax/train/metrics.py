"""The metric writer of a run: workdir/metrics.jsonl, TensorBoard events and the console's progress line.

What it writes are floats made by bertjax.core.metrics.finalize from the metric values the steps return.
"""

import json
import os
import sys


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
