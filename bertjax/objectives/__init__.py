"""Pretraining objectives by name: a config lists `objectives = {name: weight}` and the loss is the sum.

Each objective module has `loss(outputs, batch) -> (loss_sum, metrics)` (float32 sum over its targets;
metrics a flat dict of bertjax.metrics types, computed only when reported) and `count(batch)`, the number of
its targets, known before the forward pass. Dividing each sum by the count of the *whole* batch makes a
step with gradient accumulation exactly the large-batch step. Adding one is a module plus a line here.
"""

from bertjax.metrics import Mean
from bertjax.objectives import distill, mlm, rtd, sbo, sentence, wso

REGISTRY = {
    "mlm": mlm,
    "nsp": sentence.nsp,
    "sop": sentence.sop,
    "rtd": rtd,
    "sbo": sbo,
    "wso": wso,
    "sso": sentence.sso,
    # Against a frozen teacher (configs/distill.py; the model is then a bertjax.model.distill.Distiller).
    "distill_ce": distill.ce,
    "distill_cos": distill.cos,
    "distill_hidden": distill.hidden,
    "distill_attention": distill.attention,
}
SENTENCE_OBJECTIVES = ("nsp", "sop", "sso")  # each trains on its own pairs (data.instances' format of its name)
SENTENCE_CLASSES = {"nsp": 2, "sop": 2, "sso": 3}


def counts(objectives: dict, batch) -> dict:
  """Targets per objective in `batch` (the normalizers of the losses)."""
  return {name: REGISTRY[name].count(batch) for name in objectives}


def total_loss(objectives: dict, outputs, batch, denominators=None):
  """Weighted sum of the objectives' mean losses (sums over `denominators`, default: this batch's
  counts), and all their metrics (plus `loss`)."""
  import jax.numpy as jnp

  denominators = counts(objectives, batch) if denominators is None else denominators
  total, metrics = 0.0, {}
  for name, weight in objectives.items():
    loss_sum, m = REGISTRY[name].loss(outputs, batch)
    total = total + weight * loss_sum / jnp.maximum(denominators[name], 1e-8)
    metrics.update(m)
  metrics["loss"] = Mean(total, 1.0)
  return total, metrics
