"""The multiple-choice family's part of `python -m bertjax.finetune.predict`: the chosen answer of each example
of a JSONL file ({"context", "question", "choices"}, one a line; labels not needed) or of SWAG's CSV (.csv)."""


import numpy as np

from bertjax.finetune import predict as cli
from bertjax.finetune.multiple_choice import data as mc_data
from bertjax.finetune.multiple_choice.task import MASKED
from bertjax.finetune.tasks import TOKEN_FIELDS

DEFAULT_SEQ_LEN = 128


def read_inputs(args, ft_config) -> mc_data.Examples:
  """The examples, read and checked before the model is loaded (labels optional: -1 when absent)."""
  del ft_config
  cli.only_flags(args, ("input",), "multiple_choice")
  if args.input.endswith(".csv"):
    return mc_data.read_swag(args.input, labeled=False)
  return mc_data.read_jsonl(args.input, labeled=False)


def predict(tm, ex: mc_data.Examples, args, ft_config) -> dict:
  """Scores [N, C] of every (context, choice) pair, padding choices at MASKED."""
  from bertjax.finetune import batches, train

  seq_len = args.seq_len or (ft_config.seq_len if ft_config is not None else DEFAULT_SEQ_LEN)
  arrays = mc_data.encode(ex, tm.tokenizer, seq_len)
  tokens = {k: arrays[k] for k in TOKEN_FIELDS}
  out = np.asarray(train.predict(tm.params, tokens, tm.model, args.batch_size,
                                 batches.prediction_layout(tokens, args.batch_size)))
  return dict(examples=ex, scores=np.where(arrays["choice_mask"] > 0, out, MASKED))


def records(result: dict) -> list:
  """One object per example: the chosen choice's index and text, and every choice's score."""
  ex, scores = result["examples"], result["scores"]
  rows = []
  for i, options in enumerate(ex.choices):
    k = int(scores[i].argmax())
    rows.append(dict(choice=k, text=options[k], scores=[float(x) for x in scores[i, :len(options)]]))
  return rows


def write(directory: str, result: dict) -> list:
  """predictions.jsonl (the records) in `directory`; returns its path."""
  return cli.write_records(directory, records(result))
