"""The classification family's part of `python -m bertjax.finetune.predict`: labels (or regression scores) of
texts and text pairs from a GLUE-layout TSV (the fine-tuning run's columns), a file of one example a line
(TAB between a pair's texts) or --text / --text_b."""


import ml_collections
import numpy as np

from bertjax.core.errors import UserError
from bertjax.finetune import predict as cli
from bertjax.finetune.classification import data as task_data
from bertjax.finetune.tasks import TOKEN_FIELDS

DEFAULT_SEQ_LEN = 128
# The columns of a TSV when the model does not sit in a fine-tuning workdir: GLUE's single-sentence layout.
DEFAULT_TASK = dict(text_a="sentence", text_b="", label="", labels="", header=True)


def read_inputs(args, ft_config) -> task_data.Examples:
  """The texts to classify (labels 0), read and checked before the model is loaded."""
  cli.only_flags(args, ("input", "lines", "text", "text_b"), "classification")
  if args.input:
    task = ft_config.task if ft_config is not None else ml_collections.ConfigDict(DEFAULT_TASK)
    return task_data.read_tsv(args.input, task, labeled=False)
  if args.lines:
    rows = [(n, line.split("\t")) for n, line in cli.read_lines(args.lines)]
    bad = next(((n, p) for n, p in rows if len(p) > 2 or len(p) != len(rows[0][1])), None)
    if bad is not None:
      raise UserError(f"{args.lines}:{bad[0]}: {len(bad[1])} tab-separated texts where the first line has "
                      f"{len(rows[0][1])}; give one text a line, or a pair as TEXT<TAB>TEXT on every line")
    pairs = len(rows[0][1]) == 2
    return task_data.Examples([p[0] for _, p in rows], [p[1] for _, p in rows] if pairs else None,
                              np.zeros(len(rows), np.int32))
  if args.text_b and not args.text:
    raise UserError("--text_b needs --text (the pair's first text)")
  return task_data.Examples([args.text], [args.text_b] if args.text_b else None, np.zeros(1, np.int32))


def _label_names(tm, ft_config) -> list:
  """The class names: the model's own (an HF import's id2label), else the fine-tuning run's task.labels."""
  names = tm.info.get("labels") or []
  if not names and ft_config is not None:
    names = task_data.label_names(ft_config.task)
  return list(names)


def predict(tm, examples: task_data.Examples, args, ft_config) -> dict:
  """Model outputs [N, C] of the examples, encoded as fine-tuning encoded them."""
  from bertjax.finetune import batches, train

  seq_len = args.seq_len or (ft_config.seq_len if ft_config is not None else DEFAULT_SEQ_LEN)
  arrays = task_data.encode(examples, tm.tokenizer, seq_len)
  tokens = {k: arrays[k] for k in TOKEN_FIELDS}
  outputs = train.predict(tm.params, tokens, tm.model, args.batch_size, batches.prediction_layout(tokens, args.batch_size))
  return dict(examples=examples, outputs=np.asarray(outputs, np.float32), names=_label_names(tm, ft_config))


def records(result: dict) -> list:
  """One object per example: its text(s) and label (name, else class id) with the class scores (logits), or
  a regression model's score."""
  ex, out, names = result["examples"], result["outputs"], result["names"]
  rows = []
  for i, a in enumerate(ex.a):
    r = dict(text=a) if ex.b is None else dict(text=a, text_b=ex.b[i])
    if out.shape[1] == 1:
      r["score"] = float(out[i, 0])
    else:
      k = int(out[i].argmax())
      r.update(label=names[k] if k < len(names) else k, scores=[float(x) for x in out[i]])
    rows.append(r)
  return rows


def write(directory: str, result: dict) -> list:
  """predictions.jsonl (the records) in `directory`; returns its path."""
  return cli.write_records(directory, records(result))
