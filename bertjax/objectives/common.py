"""Weighted losses shared by the objectives (all in float32)."""

import jax.numpy as jnp
import optax


def softmax_xent(logits, labels, weights):
  """(loss sum, weight sum, correct sum) of a weighted cross-entropy over the last axis."""
  weights = weights.astype(jnp.float32)
  xent = optax.softmax_cross_entropy_with_integer_labels(logits.astype(jnp.float32), labels)
  correct = ((logits.argmax(-1) == labels) * weights).sum()
  return (xent * weights).sum(), weights.sum(), correct
