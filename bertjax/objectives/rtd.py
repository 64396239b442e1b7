"""ELECTRA replaced-token detection: sigmoid BCE over every real token of the corrupted input.

Besides accuracy, precision and recall of "replaced" and the replaced fraction, it reports AUC from
score histograms (counts of positive and negative tokens per probability bin), which add up over
batches like any other metric.
"""

import jax
import jax.numpy as jnp
import optax

from bertjax.core.metrics import AUC, Mean

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
      "rtd_loss": Mean((bce * w).sum(), n),
      "rtd_accuracy": Mean(((pred == y) * w).sum(), n),
      "rtd_precision": Mean(tp, (pred * w).sum()),
      "rtd_recall": Mean(tp, (y * w).sum()),
      "replaced_fraction": Mean((y * w).sum(), n),
      "rtd_auc": AUC(hist(y * w), hist((1 - y) * w)),
  }
  return (bce * w).sum(), metrics

