"""The multiple-choice family's model: BertForMultipleChoice, the one-output pooler classifier of the
classification family applied to every (context, choice) pair."""

from bertjax.finetune.classification.model import Classifier


class MultipleChoice(Classifier):
  """BertForMultipleChoice: inputs [B, choices, S] flattened to pairs, the one-output pooler classifier
  on each, scores [B, choices] (the same parameters as Classifier(num_outputs=1))."""

  tokenizer: str = ""  # the checkpoint tokenizer's spec, kept with the model so that a saved one reads back

  def __call__(self, input_ids, type_ids, groups, head_gates=None):
    shape = input_ids.shape
    flat = lambda x: x.reshape(-1, shape[-1])
    return super().__call__(flat(input_ids), flat(type_ids), flat(groups), head_gates).reshape(shape[:-1])
