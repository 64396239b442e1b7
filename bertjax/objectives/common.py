"""Weighted losses and metric pairs shared by the objectives (all in float32)."""

import jax.numpy as jnp
import optax


def softmax_xent(logits, labels, weights):
  """(mean loss, loss sum, weight sum, correct sum) of a weighted cross-entropy over the last axis."""
  weights = weights.astype(jnp.float32)
  xent = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)
  total = weights.sum()
  loss_sum = (xent * weights).sum()
  correct = ((logits.argmax(-1) == labels) * weights).sum()
  return loss_sum / jnp.maximum(total, 1e-8), loss_sum, total, correct
