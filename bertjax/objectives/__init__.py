"""Pretraining objectives by name: a config lists `objectives = {name: weight}` and the loss is the sum.

Each objective is `fn(outputs, batch) -> (loss, metrics)`: `loss` a float32 scalar (mean over its
targets), `metrics` a flat dict of (sum, count) pairs, divided only when reported, so they add up over
steps, microbatches and eval batches. Adding an objective is a new module plus a line here.
"""

from bertjax.objectives import mlm, rtd, sentence

REGISTRY = {
    "mlm": mlm.loss,
    "nsp": sentence.nsp_loss,
    "sop": sentence.sop_loss,
    "rtd": rtd.loss,
}
SENTENCE_OBJECTIVES = ("nsp", "sop")


def total_loss(objectives: dict, outputs, batch):
  """Weighted sum of the configured objectives' losses, and all their metrics (plus `loss`)."""
  total, metrics = 0.0, {}
  for name, weight in objectives.items():
    loss, m = REGISTRY[name](outputs, batch)
    total = total + weight * loss
    metrics.update(m)
  metrics["loss"] = (total, 1.0)
  return total, metrics
