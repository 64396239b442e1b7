"""The multiple-choice family's data: SWAG's CSV layout (`swag:DIR`) and a JSONL layout (`jsonl:DIR`, one
{"context", "question", "choices", "label"} a line) read and checked, and encoded to one (context, choice) pair
per row with the checkpoint's template."""

import csv
import dataclasses
import os

import numpy as np

from bertjax.core.errors import UserError
from bertjax.finetune import tasks
from bertjax.hf.tokenizers import encode_example

SWAG_ENDINGS = ("ending0", "ending1", "ending2", "ending3")


@dataclasses.dataclass
class Examples:
  """One split: the context and, per choice, the text paired with it (question + choice), and labels."""

  contexts: list
  choices: list  # list of lists of str (question and choice joined)
  labels: np.ndarray  # int32 index of the right choice
  path: str


def _join(question: str, choice: str) -> str:
  """The second segment of a pair: RACE-style cloze questions with "_" get the choice in the blank
  (ALBERT's run_race), others are followed by it (SWAG's sent2 + ending, as run_swag)."""
  if "_" in question:
    return question.replace("_", choice)
  return f"{question} {choice}".strip()


def _label(value, n_choices: int, where: str, labeled: bool = True) -> int:
  if value in (None, "") and not labeled:  # examples to predict may come without labels: -1
    return -1
  try:
    label = int(value)
  except (TypeError, ValueError):
    raise UserError(f"{where}: label {value!r} is not a choice index") from None
  if not 0 <= label < n_choices:
    raise UserError(f"{where}: label {label} is not one of the {n_choices} choices (0-based)")
  return label


def read_swag(path: str, labeled: bool = True) -> Examples:
  """SWAG's CSV (swagaf data/{train,val}.csv): sent1 is the context, sent2 + each of ending0..3 the
  continuations, label the right ending (`labeled` False: the label column may be absent or empty, -1)."""
  if not os.path.isfile(path):
    raise UserError(f"{path}:0: no such file; point --config.task.source=swag:DIR at SWAG's data directory")
  contexts, choices, labels = [], [], []
  with open(path, encoding="utf-8", newline="") as f:
    rows = csv.DictReader(f)
    need = ("sent1", "sent2") + (("label",) if labeled else ()) + SWAG_ENDINGS
    missing = [c for c in need if c not in (rows.fieldnames or ())]
    if missing:
      raise UserError(f"{path}:1: no column(s) {', '.join(missing)}; SWAG's CSV has sent1, sent2, ending0-3, "
                      "label (the test split has no labels)")
    for row in rows:
      where = f"{path}:{rows.line_num}"
      contexts.append(row["sent1"])
      choices.append([_join(row["sent2"], row[e]) for e in SWAG_ENDINGS])
      labels.append(_label(row.get("label"), len(SWAG_ENDINGS), where, labeled))
  if not contexts:
    raise UserError(f"{path}:2: no examples in the file")
  return Examples(contexts, choices, np.asarray(labels, np.int32), path)


def read_jsonl(path: str, labeled: bool = True) -> Examples:
  """One JSON object a line: {"context", "question", "choices": [...], "label"} (question may be empty; with
  `labeled` False label may be absent, -1)."""
  contexts, choices, labels = [], [], []
  shape = '{"context", "question", "choices": [at least 2], "label"}'
  for _, where, row in tasks.jsonl_objects(path, shape):
    if not isinstance(row.get("choices"), list) or "context" not in row or len(row["choices"]) < 2:
      raise UserError(f"{where}: expected {shape}")
    contexts.append(str(row["context"]))
    choices.append([_join(str(row.get("question", "")), str(c)) for c in row["choices"]])
    labels.append(_label(row.get("label"), len(row["choices"]), where, labeled))
  if not contexts:
    raise UserError(f"{path}:1: no examples in the file")
  return Examples(contexts, choices, np.asarray(labels, np.int32), path)


def read_split(task, train: bool) -> Examples:
  """The training or evaluation examples of task.source (swag:DIR or jsonl:DIR)."""
  kind, _, arg = task.source.partition(":")
  name = task.train_file if train else task.eval_file
  if kind == "swag" and arg:
    return read_swag(os.path.join(arg, name))
  if kind == "jsonl" and arg:
    return read_jsonl(os.path.join(arg, name))
  raise UserError(f"unknown multiple-choice source {task.source!r}; use --config.task.source=swag:DIR or jsonl:DIR")


def subsample(ex: Examples, n: int, seed: int) -> Examples:
  """A fixed random subset of n examples in file order (all when n is 0 or at least the split)."""
  if not n or n >= len(ex.contexts):
    return ex
  idx = np.sort(np.random.default_rng(seed).choice(len(ex.contexts), n, replace=False))
  return Examples([ex.contexts[i] for i in idx], [ex.choices[i] for i in idx], ex.labels[idx], ex.path)


def encode(ex: Examples, tokenizer, seq_len: int, num_choices: int = 0) -> dict:
  """Arrays [N, C, seq_len] (input_ids, type_ids, groups) of every (context, choice) pair with the
  checkpoint's template, label [N] and choice_mask [N, C] (0 for padding choices); C is the widest
  example's choice count, or num_choices when larger."""
  n = len(ex.contexts)
  c = max(num_choices, max(len(x) for x in ex.choices))
  ids = np.full((n, c, seq_len), tokenizer.special.pad, np.int32)
  types, groups = np.zeros((n, c, seq_len), np.int32), np.zeros((n, c, seq_len), np.int32)
  mask = np.zeros((n, c), np.float32)
  for i, (context, options) in enumerate(zip(ex.contexts, ex.choices)):
    for j, option in enumerate(options):
      row, row_types = encode_example(tokenizer, context, option, seq_len)
      ids[i, j, :len(row)], types[i, j, :len(row)], groups[i, j, :len(row)] = row, row_types, 1
      mask[i, j] = 1.0
  ids[mask == 0, 0] = tokenizer.special.cls  # padding choices: a lone [CLS], masked out of the softmax
  groups[mask == 0, 0] = 1
  return dict(input_ids=ids, type_ids=types, groups=groups, label=ex.labels, choice_mask=mask)
