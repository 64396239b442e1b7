"""The task interface of the fine-tuning trainer: what a task family provides, and the registry of families.

The trainer (bertjax.finetune.train: seeds, optimizer and schedule, (seed, step)-pure batches, logging,
evaluation, results.json, saved models) and `python -m bertjax.finetune.predict` exist once; a task family
(classification: GLUE's sentence(-pair) classification and regression; squad: span extraction; tagging: token
classification; multiple_choice) is a package, bertjax/finetune/KIND/, whose `family` module registers it
(`register(Family(KIND, task, io, predict))`) and which `config.task.kind` chooses. docs/finetune_tasks.md
describes what a family provides; bertjax/finetune/classification/ is the reference implementation.
"""

import dataclasses
import importlib
import json
import os

from bertjax.core.errors import UserError

# kind -> the `family` module of a built-in family, imported on first use (importing it registers the family).
# A family outside bertjax calls `register` when its own module is imported.
KINDS = {
    "classification": "bertjax.finetune.classification.family",
    "squad": "bertjax.finetune.squad.family",
    "tagging": "bertjax.finetune.tagging.family",
    "multiple_choice": "bertjax.finetune.multiple_choice.family",
    "graph": "bertjax.finetune.graph.family",
}
_REGISTRY = {}  # kind -> Family
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


@dataclasses.dataclass(frozen=True)
class Stage:
  """One training stage of a task that trains in several (a task module's optional `stages(config)`; without
  it, one stage of `task.loss` over every parameter). Each stage runs the run's step count with a fresh optimizer.

  loss       (outputs, batch) -> per-example loss [B], as a task's `loss`
  trainable  params -> a tree of 0/1 multipliers (scalars or arrays broadcasting along a stacked axis) of the
             gradients and updates; None: everything trains
  lr_scale   the learning rate's multiplier in this stage
  """

  loss: object
  trainable: object = None
  lr_scale: float = 1.0


@dataclasses.dataclass(frozen=True)
class Family:
  """A task family as it registers itself.

  kind     its config.task.kind
  task     the task module the trainer calls (validate, read, prepare, model, init_params, loss, evaluate,
           save_model; docs/finetune_tasks.md)
  io       its models on disk: MODEL_FILE (the file that marks a saved model), HF_SUFFIXES (the transformers
           classes it reads, e.g. "ForTokenClassification"), build, save, load, read_hf, write_hf
  predict  what `python -m bertjax.finetune.predict` calls for it (read inputs, predict, write)
  variant  optional config -> the task module a config runs instead of `task` (classification: the early-exit
           task when config.early_exit is set), or None
  """

  kind: str
  task: object
  io: object
  predict: object = None
  variant: object = None


def kind_of(config) -> str:
  """The task family of a fine-tuning config (`task.kind`, default classification)."""
  return config.task.get("kind", DEFAULT_KIND) or DEFAULT_KIND


def register(fam: Family) -> None:
  """Adds (or replaces) the family `fam.kind`; a family package calls it when it is imported."""
  _REGISTRY[fam.kind] = fam


def family(kind: str) -> Family:
  """The Family `kind`, importing a built-in family's package on first use (a one-line UserError for an
  unknown kind)."""
  if kind not in _REGISTRY and kind in KINDS:
    importlib.import_module(KINDS[kind])
  if kind not in _REGISTRY:
    raise UserError(f"task.kind={kind!r} is not a fine-tuning task family; use one of "
                    f"{', '.join(sorted(set(KINDS) | set(_REGISTRY)))}")
  return _REGISTRY[kind]


def families() -> dict:
  """kind -> Family of every family: the built-in ones and those registered from outside."""
  for kind in KINDS:
    family(kind)
  return dict(_REGISTRY)


def get(config):
  """The task module of `config` (a one-line UserError for an unknown task.kind): its family's, or the one the
  family's `variant(config)` names (classification: the early-exit task when config.early_exit is set)."""
  fam = family(kind_of(config))
  return fam.variant(config) if fam.variant is not None else fam.task


def jsonl_objects(path: str, shape: str):
  """(line number, where, object) for each non-blank line of a JSONL task file (where: "PATH:LINE"); a missing file, a line that
  is no JSON or not an object is a one-line UserError (`shape`: what an object holds, for the message)."""
  if not os.path.isfile(path):
    raise UserError(f"{path}:0: no such file; point --config.task.source=jsonl:DIR at the task's directory")
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      where = f"{path}:{number}"
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise UserError(f"{where}: not a JSON object ({e.msg})") from None
      if not isinstance(row, dict):
        raise UserError(f"{where}: expected a JSON object with {shape}")
      yield number, where, row
