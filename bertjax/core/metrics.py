"""Metric values that add up on device and are computed only on report (Mean, Sum, AUC).

A step returns a flat dict name -> metric; dicts of several steps or eval batches add up leaf by leaf
(`sum_metrics`), and `finalize` turns each into a float the way its type says. The objectives, the steps
and the fine-tuning trainer all report through these; bertjax.train.metrics writes them out.
"""

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
