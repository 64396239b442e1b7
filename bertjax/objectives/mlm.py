"""Masked LM: cross-entropy over the gathered masked positions (padded slots weigh 0). Under ERNIE's unit
masking it also reports the units masked per example and the units the prediction budget cut."""

from bertjax.core.metrics import Mean
from bertjax.objectives.common import softmax_xent


def count(batch):
  return batch["mlm_weights"].sum()


def loss(outputs, batch):
  loss_sum, n, correct = softmax_xent(outputs["mlm_logits"], batch["mlm_labels"], batch["mlm_weights"])
  metrics = {"mlm_loss": Mean(loss_sum, n), "mlm_accuracy": Mean(correct, n)}
  if "units_masked" in batch:  # masking.scheme=ernie: per real example
    examples = batch["example_weight"].sum()
    metrics["units_masked"] = Mean(batch["units_masked"].sum(), examples)
    metrics["units_cut"] = Mean(batch["units_cut"].sum(), examples)
  return loss_sum, metrics
