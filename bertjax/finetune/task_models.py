"""Fine-tuned task models on disk, for every family: the TaskModel in memory, which family a directory holds
(a bertjax task model, or a transformers task class named by its config.json), and loading, saving and
exporting through that family's package (`Family.io`: KIND/hf.py).

A bertjax task model is a single-model workdir (hf.workdir.write: config.json, the step-0 params
checkpoint) plus the family's own file: `task.json` (tagging, multiple choice: kind, labels, head dropout,
windowing), `classifier.json` (classification: what compress.prune reads) or `qa.json` (squad).
"""

import dataclasses
import json
import os
import shutil

import jax
import numpy as np

from bertjax.core.errors import UserError
from bertjax.finetune import tasks
from bertjax.hf import configs, convert, safetensors_io, tokenizers as hf_tokenizers, weights as W
from bertjax.hf import workdir as wd

TASK_FILE = "task.json"


@dataclasses.dataclass
class TaskModel:
  """A fine-tuned task model: its kind, pretraining-style run config, deterministic flax module, params
  (embeddings, encoder, [pooler], head), tokenizer (or None) and task info (labels, windowing, settings)."""

  kind: str
  config: object
  model: object
  params: dict
  tokenizer: object
  info: dict


def copy_tokenizer(spec: str, directory: str) -> str:
  """Copies the tokenizer files of `spec` into directory/tokenizer; returns the spec that loads the copy."""
  if not spec:
    return ""
  tok = hf_tokenizers.load_any(spec)
  out = os.path.join(directory, "tokenizer")
  os.makedirs(out, exist_ok=True)
  if os.path.isdir(tok.path):
    for name in hf_tokenizers.TOKENIZER_FILES:
      if os.path.isfile(os.path.join(tok.path, name)):
        shutil.copy(os.path.join(tok.path, name), os.path.join(out, name))
    return f"{tok.kind}:{out}"
  target = os.path.join(out, os.path.basename(tok.path))
  shutil.copy(tok.path, target)
  return spec.replace(tok.path, target, 1)


def write_task_dir(directory: str, kind: str, run_config, params, info: dict) -> None:
  """The task.json layout (tagging, multiple choice): the params checkpoint and task.json (`info` with the kind)."""
  wd.write(directory, run_config, jax.tree.map(np.asarray, params), dict(task=kind))
  with open(os.path.join(directory, TASK_FILE), "w") as f:
    json.dump(dict(info, kind=kind), f, indent=2)


def load_task_dir(directory: str, kind: str, build) -> TaskModel:
  """A task model written by `write_task_dir` (tagging, multiple choice): `build(run_config, info)` makes its
  deterministic flax model, whose params are restored from the directory."""
  from bertjax.finetune.model import restore_params

  info, run_config, tok = read_task_dir(directory)
  model = build(run_config, info)
  return TaskModel(kind, run_config, model, restore_params(directory, model), tok, info)


def read_task_dir(directory: str) -> tuple:
  """(task.json's info, run config, tokenizer or None) of a directory written by `write_task_dir`."""
  with open(os.path.join(directory, TASK_FILE)) as f:
    info = json.load(f)
  run_config = wd.load_config(directory)
  spec = run_config.data.get("tokenizer", "")
  return info, run_config, hf_tokenizers.load_any(spec) if spec else None


def save(directory: str, kind: str, run_config, params, info: dict) -> None:
  """Writes a task model in its family's layout: config.json (the encoder's run config, its data.tokenizer
  naming a copy of the tokenizer in directory/tokenizer), the params checkpoint and the family's file (`info`:
  labels, classifier_dropout, tag scheme, ...; info["tokenizer"] is the spec of the tokenizer to copy)."""
  run_config, info = run_config.copy_and_resolve_references(), dict(info)
  run_config.data.tokenizer = copy_tokenizer(info.pop("tokenizer", "") or run_config.data.tokenizer, directory)
  tasks.family(kind).io.save(directory, run_config, params, info)


def _hf_config(directory: str) -> dict | None:
  """A transformers directory's config.json (not a bertjax workdir's), else None."""
  path = os.path.join(directory, "config.json")
  if os.path.isdir(os.path.join(directory, "checkpoints")) or not os.path.isfile(path):
    return None
  with open(path) as f:
    return json.load(f)


def kind_of_dir(directory: str) -> str:
  """The family of a task-model directory, from its small files alone (no weights read): task.json's kind, the
  family file it holds (classifier.json, qa.json), or the architectures of a transformers config.json."""
  fams = tasks.families()
  if os.path.isfile(os.path.join(directory, TASK_FILE)):
    with open(os.path.join(directory, TASK_FILE)) as f:
      return json.load(f)["kind"]
  for kind, fam in fams.items():
    if fam.io.MODEL_FILE != TASK_FILE and os.path.isfile(os.path.join(directory, fam.io.MODEL_FILE)):
      return kind
  hf = _hf_config(directory)
  if hf is None:
    raise UserError(f"no fine-tuned task model at {directory!r}; fine-tune with --config.save_model=True "
                    "(WORKDIR/seed_S/model) or pass a transformers task-model directory")
  archs = hf.get("architectures") or []
  for kind, fam in fams.items():
    if any(a.endswith(s) for a in archs for s in fam.io.HF_SUFFIXES):
      return kind
  suffixes = sorted(s for fam in fams.values() for s in fam.io.HF_SUFFIXES)
  raise UserError(f"{directory}/config.json names architectures {archs}; bertjax reads task models of the classes "
                  f"*{', *'.join(suffixes)}")


def load(directory: str) -> TaskModel:
  """A task model written by `save` (or by a seed's save_model), or a transformers task-model directory
  (*ForSequenceClassification, *ForTokenClassification, *ForQuestionAnswering, BertForMultipleChoice: imported
  on the fly)."""
  io = tasks.family(kind_of_dir(directory)).io
  return io.load(directory) if os.path.isfile(os.path.join(directory, io.MODEL_FILE)) else io.read_hf(directory)


def read_hf(hf_dir: str) -> TaskModel:
  """Imports a transformers task-model directory through its family's reader."""
  return tasks.family(kind_of_dir(hf_dir)).io.read_hf(hf_dir)


def write_hf(task_model: TaskModel, out_dir: str) -> str:
  """Exports a task model as its family's transformers class (config.json, model.safetensors, the tokenizer
  files); returns out_dir."""
  return tasks.family(task_model.kind).io.write_hf(task_model, out_dir)


def hf_export_config(task_model: TaskModel, classes: dict, what: str) -> tuple:
  """(family, special ids, config.json dict) of a task model's transformers export as `classes[family]` (the
  family's task class), with its classifier_dropout; a family without one is a one-line error naming `what`."""
  config = task_model.config
  family = configs.family_for(config)
  if family not in classes:
    raise UserError(f"transformers has no {what} class bertjax exports for {family}; export supports "
                    f"{', '.join(classes)}")
  tok = task_model.tokenizer
  special = tok.special if tok is not None else convert.SpecialIds(0, 1, 2, 3, 4)
  hf = configs.to_hf(config, family, classes[family], special)
  hf["classifier_dropout"] = task_model.info.get("classifier_dropout", 0.1)
  return family, special, hf


def hf_dropout(hf: dict) -> float:
  """The head dropout a transformers config states (classifier_dropout, ALBERT's classifier_dropout_prob, else
  hidden_dropout_prob)."""
  return float(hf.get("classifier_dropout") or hf.get("classifier_dropout_prob") or hf.get("hidden_dropout_prob", 0.1))


def read_classifier_head(hf_dir: str) -> tuple:
  """(hf config, convert.Imported, tensors, params with embeddings, encoder and `classifier` from classifier.weight
  / .bias) of a transformers task directory whose head is one linear layer (token classification, multiple choice)."""
  with open(os.path.join(hf_dir, "config.json")) as f:
    hf = json.load(f)
  imported = convert.read_hf(hf_dir)
  tensors = convert._modern_names(safetensors_io.read_dir(hf_dir))
  if "classifier.weight" not in tensors:
    raise UserError(f"{hf_dir} lacks the task head's classifier.weight")
  params = {k: imported.params[k] for k in ("embeddings", "encoder")}
  target = {"classifier": {"kernel": np.zeros(tuple(tensors["classifier.weight"].shape[::-1])),
                           "bias": np.zeros(tensors["classifier.bias"].shape)}}
  head, missing = W.import_tensors(W.entries_of("classifier", "classifier"), tensors, target)
  if missing:
    raise UserError(f"{hf_dir} lacks the task head's {missing[0]}")
  params.update(head)
  return hf, imported, tensors, params
