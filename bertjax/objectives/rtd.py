"""ELECTRA replaced-token detection: sigmoid BCE over every real token of the corrupted input.

Besides accuracy, precision and recall of "replaced" and the replaced fraction, it reports AUC from
score histograms (counts of positive and negative tokens per probability bin), which add up over
batches like any other metric pair.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax

AUC_BINS = 1000


def _token_weights(batch):
  return (batch["groups"] > 0).astype(jnp.float32) * batch["example_weight"][:, None]


def count(batch):
  """Every real token of every real example is a target."""
  return _token_weights(batch).sum()


def loss(outputs, batch):
  logits, labels = outputs["rtd_logits"], outputs["rtd_labels"]
  w = _token_weights(batch)
  y = labels.astype(jnp.float32)
  bce = optax.sigmoid_binary_cross_entropy(logits, y)
  n = w.sum()
  pred = (logits > 0).astype(jnp.float32)
  tp = (pred * y * w).sum()
  bins = jnp.clip((jax.nn.sigmoid(logits) * AUC_BINS).astype(jnp.int32), 0, AUC_BINS - 1)
  hist = lambda weights: jnp.zeros(AUC_BINS, jnp.float32).at[bins.ravel()].add(weights.ravel())
  metrics = {
      "rtd_loss": ((bce * w).sum(), n),
      "rtd_accuracy": (((pred == y) * w).sum(), n),
      "rtd_precision": (tp, (pred * w).sum()),
      "rtd_recall": (tp, (y * w).sum()),
      "replaced_fraction": ((y * w).sum(), n),
      "rtd_auc": (hist(y * w), hist((1 - y) * w)),
  }
  return (bce * w).sum(), metrics


def auc_from_histograms(pos, neg) -> float:
  """ROC AUC from per-bin counts of positives and negatives (ties within a bin count half)."""
  pos, neg = np.asarray(pos, np.float64), np.asarray(neg, np.float64)
  if pos.sum() == 0 or neg.sum() == 0:
    return float("nan")
  neg_below = np.cumsum(neg) - neg
  return float((pos * (neg_below + 0.5 * neg)).sum() / (pos.sum() * neg.sum()))
