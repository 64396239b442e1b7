"""The multiple-choice family's models on disk: a fine-tuned MultipleChoice directory (task.json) and
transformers' BertForMultipleChoice, in and out."""

import jax
import numpy as np

from bertjax.core.errors import UserError
from bertjax.finetune import task_models
from bertjax.finetune.multiple_choice.model import MultipleChoice
from bertjax.finetune.task_models import TaskModel
from bertjax.hf import convert, weights as W
from bertjax.hf.inference import on_device
from bertjax.model import config as model_config

MODEL_FILE = task_models.TASK_FILE
HF_SUFFIXES = ("ForMultipleChoice",)
CHOICE_CLASSES = {"bert": "BertForMultipleChoice"}


def build(run_config, info: dict, cfg=None) -> MultipleChoice:
  """The deterministic MultipleChoice model (pooler head, one output) from its run config and info."""
  cfg = cfg or model_config.encoder_config(run_config.model)
  return MultipleChoice(cfg, 1, info.get("classifier_dropout", 0.1), deterministic=True, head="pooler")


def save(directory: str, run_config, params, info: dict) -> None:
  """The task.json layout (classifier_dropout)."""
  task_models.write_task_dir(directory, "multiple_choice", run_config, params, info)


def load(directory: str) -> TaskModel:
  """A multiple-choice model written by `save` (or a seed's save_model)."""
  return task_models.load_task_dir(directory, "multiple_choice", build)


def read_hf(hf_dir: str) -> TaskModel:
  """Imports a transformers BertForMultipleChoice directory: the encoder and pooler through bertjax's importer,
  the one-output classifier from its tensors."""
  hf, imported, _, params = task_models.read_classifier_head(hf_dir)
  if imported.family not in CHOICE_CLASSES:
    raise UserError(f"{imported.family} multiple-choice models are not supported; bertjax reads BertForMultipleChoice")
  if imported.pooler is None:
    raise UserError(f"{hf_dir} has no pooler; a {hf.get('architectures')} checkpoint has one (bert.pooler.dense)")
  params["pooler"] = imported.pooler
  info = dict(labels=[], scheme="", classifier_dropout=task_models.hf_dropout(hf), family=imported.family)
  model = build(imported.config, info)
  return TaskModel("multiple_choice", imported.config, model, on_device(params), imported.tokenizer, info)


def write_hf(task_model: TaskModel, out_dir: str) -> str:
  """Exports a multiple-choice model as BertForMultipleChoice (config.json, model.safetensors, the tokenizer
  files); returns out_dir."""
  family, special, hf = task_models.hf_export_config(task_model, CHOICE_CLASSES, "multiple_choice")
  params = jax.tree.map(np.asarray, task_model.params)
  tensors = convert.encoder_tensors(task_model.config, params, family, special)
  entries = W.entries_of("classifier", "classifier") + W.entries_of("pooler", W.PREFIX[family] + "pooler.dense")
  tensors.update(W.export_tensors(entries, params))
  return convert.write_dir(out_dir, hf, tensors, task_model.tokenizer)
