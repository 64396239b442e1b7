"""Masked LM: cross-entropy over the gathered masked positions (padded slots weigh 0)."""

from bertjax.core.metrics import Mean
from bertjax.objectives.common import softmax_xent


def count(batch):
  return batch["mlm_weights"].sum()


def loss(outputs, batch):
  loss_sum, n, correct = softmax_xent(outputs["mlm_logits"], batch["mlm_labels"], batch["mlm_weights"])
  return loss_sum, {"mlm_loss": Mean(loss_sum, n), "mlm_accuracy": Mean(correct, n)}
