"""Sentence-pair objectives on the [CLS] head: next-sentence (NSP), sentence-order (SOP) and StructBERT's
sentence-structural (SSO) prediction.

NSP: label 0 = B really follows A, 1 = B comes from another document (BERT's convention).
SOP: label 0 = A, B in document order, 1 = swapped (ALBERT).
SSO: label 0 = B follows A, 1 = B precedes A, 2 = B comes from another document (StructBERT), 1/3 each.
"""

import types

from bertjax.core.metrics import Mean
from bertjax.objectives.common import softmax_xent


def count(batch):
  return batch["example_weight"].sum()


def _make(name):
  def loss(outputs, batch):
    loss_sum, n, correct = softmax_xent(outputs["sentence_logits"], batch["sentence_label"], batch["example_weight"])
    return loss_sum, {f"{name}_loss": Mean(loss_sum, n), f"{name}_accuracy": Mean(correct, n)}

  return types.SimpleNamespace(loss=loss, count=count)


nsp = _make("nsp")
sop = _make("sop")
sso = _make("sso")
