"""SpanBERT's span-boundary objective: cross-entropy of every masked token of a span predicted from the span's
boundary tokens and its position in the span (the SBO head), over the MLM slots that have such a target.

A slot has one when both boundaries are text tokens (a span touching [CLS] or [SEP] has none, as in SpanBERT)
and it lies within the first SBO_MAX_TARGETS tokens of its span; `masking.span_boundaries` gives the
boundaries. SpanBERT's loss is MLM + SBO, each a mean over its own targets.
"""

import jax.numpy as jnp

from bertjax.core.metrics import Mean
from bertjax.model.heads import SBO_MAX_TARGETS
from bertjax.objectives.common import softmax_xent


def weights(batch):
  """[B, P]: 1 for an MLM slot with an SBO target."""
  offset = batch["mlm_positions"] - batch["span_left"] - 1
  return batch["span_weights"] * (offset < SBO_MAX_TARGETS).astype(jnp.float32)


def count(batch):
  return weights(batch).sum()


def loss(outputs, batch):
  loss_sum, n, correct = softmax_xent(outputs["sbo_logits"], batch["mlm_labels"], weights(batch))
  return loss_sum, {"sbo_loss": Mean(loss_sum, n), "sbo_accuracy": Mean(correct, n)}
