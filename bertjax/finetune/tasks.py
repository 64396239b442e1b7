"""The task interface of the fine-tuning trainer: what a task family provides, and the registry of families.

The trainer (bertjax.finetune.train: seeds, optimizer and schedule, (seed, step)-pure batches, logging,
evaluation, results.json, saved models) exists once; a task family (classification: GLUE's sentence(-pair)
classification and regression; span extraction; token classification; ...) plugs into it as a module
registered under a name in KINDS and chosen by `config.task.kind`. docs/finetune_tasks.md describes the
module's functions; bertjax/finetune/classification.py is the reference implementation.
"""

import dataclasses
import importlib

from bertjax.core.errors import UserError

# kind -> module. A new family adds one line here (its module provides the functions of docs/finetune_tasks.md).
KINDS = {
    "classification": "bertjax.finetune.classification",
}
DEFAULT_KIND = "classification"  # configs written before task.kind existed are classification runs

# Fields every task's model reads (input_ids [.., S], type_ids [.., S], groups [.., S]: 0 padding, else 1):
# per-token arrays whose last axis runs along the sequence, so the trainer may cut batches to a shorter length.
TOKEN_FIELDS = ("input_ids", "type_ids", "groups")


@dataclasses.dataclass
class TaskData:
  """What a task's `prepare` returns: the encoded splits and what the trainer reports about them.

  train, eval  field -> numpy array with a leading example axis (rows fed to the model); always input_ids,
               type_ids and groups, plus whatever the task's loss and evaluation read (labels, span
               positions, ...). A field may have more axes (e.g. [N, choices, S] for multiple choice).
  info         JSON-able facts for the log line and results.json (train_examples, eval_examples,
               skipped_rows, ... ; train_examples and eval_examples are expected).
  model        keyword arguments the task's `model` needs (e.g. num_outputs, head), fixed by the data.
  extra        anything else `evaluate` needs that is not per-row arrays (e.g. SQuAD's contexts, offsets).
  token_fields fields padded along their LAST axis to seq_len (0 beyond a row's end), which the trainer may
               cut to a shorter length (length buckets); TOKEN_FIELDS plus any per-token labels.
  """

  train: dict
  eval: dict
  info: dict
  model: dict = dataclasses.field(default_factory=dict)
  extra: object = None
  token_fields: tuple = TOKEN_FIELDS


def kind_of(config) -> str:
  """The task family of a fine-tuning config (`task.kind`, default classification)."""
  return config.task.get("kind", DEFAULT_KIND) or DEFAULT_KIND


def get(config):
  """The task module of `config` (a one-line UserError for an unknown task.kind)."""
  kind = kind_of(config)
  if kind not in KINDS:
    raise UserError(f"task.kind={kind!r} is not a fine-tuning task family; use one of {', '.join(sorted(KINDS))}")
  return importlib.import_module(KINDS[kind])
