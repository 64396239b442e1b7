"""Fine-tuned tagging, multiple-choice and sequence-classification models from the command line: tag a sentence,
export to transformers, import from transformers.

  python -m bertjax.finetune.predict --model=W/seed_0/model --text="Peter Blackburn visited Brussels ."
  python -m bertjax.finetune.predict --model=W/seed_0/model --export=HF_DIR   # *For{Token,Sequence}Classification, *ForMultipleChoice
  python -m bertjax.finetune.predict --model=HF_DIR --save=DIR                # HF task model -> bertjax task model

--model is a bertjax task model (fine-tuning's WORKDIR/seed_S/model, written with --config.save_model=True)
or a transformers *ForTokenClassification / *ForSequenceClassification / BertForMultipleChoice directory.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import re

from absl import flags

from bertjax.core import runtime
from bertjax.core.cli import cli, run
from bertjax.core.errors import UserError

_MODEL = flags.DEFINE_string("model", "", "a fine-tuned task model: WORKDIR/seed_S/model or an HF task directory")
_TEXT = flags.DEFINE_string("text", "", "a sentence to tag (split into words and punctuation)")
_SEQ_LEN = flags.DEFINE_integer("seq_len", 128, "the window, in subwords with [CLS] and [SEP], longer sentences slide")
_EXPORT = flags.DEFINE_string("export", "", "write the model as a transformers directory here")
_SAVE = flags.DEFINE_string("save", "", "write the model as a bertjax task model directory here")
_WORDS = re.compile(r"\w+(?:[-'.]\w+)*|[^\w\s]")  # words and punctuation, as CoNLL files split them


def words_of(text: str) -> list:
  """The words of a sentence, punctuation split off (CoNLL's tokenization, roughly)."""
  return _WORDS.findall(text)


@cli
def main(argv):
  from bertjax.finetune import tagging, task_models

  if len(argv) != 1:
    raise UserError(f"unexpected arguments {' '.join(argv[1:])}; use --model with --text, --export or --save")
  if not _MODEL.value or not (_TEXT.value or _EXPORT.value or _SAVE.value):
    raise UserError("set --model and at least one of --text (tag it), --export (HF) or --save (bertjax)")
  runtime.setup()
  tm = task_models.load(_MODEL.value)
  if _TEXT.value:
    if tm.kind != "tagging":
      raise UserError(f"{_MODEL.value} is a {tm.kind} model; --text tags sentences with a token-classification model")
    if tm.tokenizer is None:
      raise UserError(f"{_MODEL.value} has no tokenizer; copy the checkpoint's tokenizer files next to it")
    words = words_of(_TEXT.value)
    if not words:
      raise UserError("--text has no words")
    for word, tag in zip(words, tagging.tag_words(words, tm.tokenizer, tm.model, tm.params, _SEQ_LEN.value)):
      print(f"{word}\t{tag}")
  if _EXPORT.value:
    print(f"wrote {task_models.write_hf(tm, _EXPORT.value)}")
  if _SAVE.value:
    info = dict(tm.info, tokenizer=tm.tokenizer.spec() if tm.tokenizer is not None else "")
    task_models.save(_SAVE.value, tm.kind, tm.config, tm.params, info)
    print(f"wrote {_SAVE.value}")


if __name__ == "__main__":
  run(main)
