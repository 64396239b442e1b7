"""Sentence-pair objectives on the [CLS] head: next-sentence (NSP) and sentence-order (SOP) prediction."""

from bertjax.objectives.common import softmax_xent


def _sentence(name, outputs, batch):
  mean, loss_sum, n, correct = softmax_xent(
      outputs["sentence_logits"], batch["sentence_label"], batch["example_weight"])
  return mean, {f"{name}_loss": (loss_sum, n), f"{name}_accuracy": (correct, n)}


def nsp_loss(outputs, batch):
  """NSP: label 0 = B really follows A, 1 = B comes from another document (BERT's convention)."""
  return _sentence("nsp", outputs, batch)


def sop_loss(outputs, batch):
  """SOP: label 0 = A, B in document order, 1 = swapped (ALBERT)."""
  return _sentence("sop", outputs, batch)
