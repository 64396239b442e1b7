"""Task examples from GLUE-layout TSV files or tfds `glue/*`, encoded into fixed-length arrays."""

import csv
import dataclasses
import os
import sys

import numpy as np

from bertjax.core.errors import UserError
from bertjax.data import sources, trees
from bertjax.hf.tokenizers import encode_example


@dataclasses.dataclass
class Examples:
  """Texts and labels of one split; `b` is None for single-sentence tasks."""

  a: list
  b: list | None
  labels: np.ndarray  # int32 class ids, or float32 scores (regression)
  skipped: int = 0  # rows without the columns or with a label outside the task's label set


def label_names(task) -> list:
  return [x for x in task.labels.split(",") if x] if task.labels else []


def _column(header: list | None, spec: str, path: str) -> int:
  if header is None:
    return int(spec)
  if spec not in header:
    raise UserError(f"{path} has no column {spec!r} (columns: {', '.join(header)}); set --config.task.text_a/"
                    "text_b/label to its column names")
  return header.index(spec)


def read_tsv(path: str, task, labeled: bool = True) -> Examples:
  """One GLUE-layout TSV (tab-separated, no quoting); rows with too few columns or an unknown label are
  skipped and counted (MNLI has unlabeled "-" rows). `labeled` False (predicting): no label column is read
  and every label is 0."""
  if not os.path.isfile(path):
    raise UserError(f"no TSV file at {path}; point --config.task.source=tsv:DIR at a GLUE task directory")
  csv.field_size_limit(sys.maxsize)
  names = label_names(task)
  a, b, labels, skipped = [], [], [], 0
  with open(path, encoding="utf-8", newline="") as f:
    rows = csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE)
    header = next(rows) if task.header else None
    cols = [_column(header, s, path) if s else None for s in (task.text_a, task.text_b, task.label if labeled else "")]
    need = max(c for c in cols if c is not None)
    for row in rows:
      if len(row) <= need or (labeled and names and row[cols[2]] not in names):
        skipped += 1
        continue
      a.append(row[cols[0]])
      if cols[1] is not None:
        b.append(row[cols[1]])
      labels.append(0 if not labeled else names.index(row[cols[2]]) if names else float(row[cols[2]]))
  if not a:
    raise UserError(f"{path} has no usable rows ({skipped} skipped); check the columns and labels in --config.task")
  dtype = np.int32 if names else np.float32
  return Examples(a, b if cols[1] is not None else None, np.asarray(labels, dtype), skipped)


def read_tfds(name: str, split: str, task) -> Examples:
  """A tfds split (e.g. glue/rte, validation), read as pretraining's tfds sources are (without TensorFlow
  for ArrayRecord datasets; tensorflow-datasets is an optional extra)."""
  names, tf_names = label_names(task), [x for x in task.tfds_labels.split(",") if x]
  a, b, labels, skipped = [], [], [], 0
  for ex in sources.tfds_examples(sources.import_tfds(), name, split, ""):
    label = ex["label"]
    if names and not 0 <= int(label) < len(tf_names):  # test splits have label -1
      skipped += 1
      continue
    a.append(ex[task.tfds_text_a].decode("utf-8"))
    if task.tfds_text_b:
      b.append(ex[task.tfds_text_b].decode("utf-8"))
    labels.append(names.index(tf_names[int(label)]) if names else float(label))
  if not a:
    raise UserError(f"tfds {name}:{split} has no labeled examples; choose another split")
  return Examples(a, b if task.tfds_text_b else None, np.asarray(labels, np.int32 if names else np.float32), skipped)


def extra_eval_names(task) -> list:
  """Names of the further evaluation splits (task.extra_eval, e.g. MNLI's "mismatched")."""
  return [x for x in task.get("extra_eval", "").split(",") if x]


def read_split(task, train: bool, extra: str = "") -> Examples:
  """The training or evaluation examples of the configured source; `extra` names a further evaluation
  split (task.extra_eval): dev_EXTRA.tsv, or the tfds split validation_EXTRA (GLUE's MNLI names)."""
  kind, _, arg = task.source.partition(":")
  if kind == "tsv" and arg:
    name = "train.tsv" if train else f"dev_{extra}.tsv" if extra else task.eval_file
    return read_tsv(os.path.join(arg, name), task)
  if kind == "tfds" and arg:
    return read_tfds(arg, "train" if train else f"validation_{extra}" if extra else task.eval_split, task)
  raise UserError(f"unknown task source {task.source!r}; use --config.task.source=tsv:DIR or tfds:glue/NAME")


def subsample(examples: Examples, n: int, seed: int) -> Examples:
  """A fixed random subset of n examples (all of them when n is 0 or larger than the split)."""
  if not n or n >= len(examples.a):
    return examples
  idx = np.sort(np.random.default_rng(seed).choice(len(examples.a), n, replace=False))
  pick = lambda xs: [xs[i] for i in idx]
  return Examples(pick(examples.a), pick(examples.b) if examples.b is not None else None, examples.labels[idx],
                  examples.skipped)


def encode(examples: Examples, tokenizer, seq_len: int, parsed: bool = False, split: str = "train") -> dict:
  """Fixed-length arrays: input_ids, type_ids, groups (1 = real token) and label. `parsed`: each text is a bracketed
  tree (a model with tree attention): its leaves, then its nodes with their spans (node_first, node_last;
  bertjax.data.trees); a tree that does not parse or fit is a UserError naming the `split`'s example."""
  if parsed:
    if examples.b is not None:
      raise UserError("a model over given parses reads one bracketed tree per example; set --config.task.text_b=")
    return dict(trees.encode_rows(examples.a, tokenizer, seq_len, f"{split} example"), label=examples.labels)
  n = len(examples.a)
  ids = np.full((n, seq_len), tokenizer.special.pad, np.int32)
  types = np.zeros((n, seq_len), np.int32)
  groups = np.zeros((n, seq_len), np.int32)
  for i, a in enumerate(examples.a):
    row, row_types = encode_example(tokenizer, a, None if examples.b is None else examples.b[i], seq_len)
    ids[i, :len(row)], types[i, :len(row)], groups[i, :len(row)] = row, row_types, 1
  return dict(input_ids=ids, type_ids=types, groups=groups, label=examples.labels)
