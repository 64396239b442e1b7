"""StructBERT's word-structural objective: at every position of a shuffled trigram, cross-entropy of the
original token, decoded by the MLM head (`masking.shuffle_trigrams` makes the trigrams)."""

from bertjax.core.metrics import Mean
from bertjax.objectives.common import softmax_xent


def count(batch):
  return batch["wso_weights"].sum()


def loss(outputs, batch):
  loss_sum, n, correct = softmax_xent(outputs["wso_logits"], batch["wso_labels"], batch["wso_weights"])
  return loss_sum, {"wso_loss": Mean(loss_sum, n), "wso_accuracy": Mean(correct, n)}
