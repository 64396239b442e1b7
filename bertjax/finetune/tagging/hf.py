"""The tagging family's models on disk: a fine-tuned TokenClassifier's directory (task.json with the labels,
their scheme and the head dropout) and transformers' *ForTokenClassification (BERT, RoBERTa, ALBERT, ELECTRA),
in and out."""

import jax
import numpy as np

from bertjax.finetune import task_models
from bertjax.finetune.tagging import metrics as tag_metrics
from bertjax.finetune.tagging.model import TokenClassifier
from bertjax.finetune.task_models import TaskModel
from bertjax.hf import convert, weights as W
from bertjax.hf.inference import on_device
from bertjax.model import config as model_config

MODEL_FILE = task_models.TASK_FILE
HF_SUFFIXES = ("ForTokenClassification",)
TOKEN_CLASSES = {"bert": "BertForTokenClassification", "roberta": "RobertaForTokenClassification",
                 "albert": "AlbertForTokenClassification", "electra": "ElectraForTokenClassification"}


def build(run_config, info: dict, cfg=None) -> TokenClassifier:
  """The deterministic TokenClassifier of a task model from its run config and info (labels, scheme)."""
  cfg = cfg or model_config.encoder_config(run_config.model)
  return TokenClassifier(cfg, len(info["labels"]), info.get("classifier_dropout", 0.1), True, tuple(info["labels"]),
                         info.get("scheme", ""))


def save(directory: str, run_config, params, info: dict) -> None:
  """The task.json layout (labels, scheme, classifier_dropout)."""
  task_models.write_task_dir(directory, "tagging", run_config, params, info)


def load(directory: str) -> TaskModel:
  """A tagger written by `save` (or a seed's save_model)."""
  return task_models.load_task_dir(directory, "tagging", build)


def read_hf(hf_dir: str) -> TaskModel:
  """Imports a transformers *ForTokenClassification directory: the encoder through bertjax's importer, the
  classifier from its tensors, the labels from id2label and their scheme detected."""
  hf, imported, tensors, params = task_models.read_classifier_head(hf_dir)
  n = int(tensors["classifier.weight"].shape[0])
  id2label = hf.get("id2label") or {str(i): f"LABEL_{i}" for i in range(n)}
  labels = [id2label[str(i)] for i in range(n)]
  info = dict(labels=labels, scheme=tag_metrics.detect_scheme([labels]), classifier_dropout=task_models.hf_dropout(hf),
              family=imported.family)
  model = build(imported.config, info)
  return TaskModel("tagging", imported.config, model, on_device(params), imported.tokenizer, info)


def write_hf(task_model: TaskModel, out_dir: str) -> str:
  """Exports a tagger as its family's *ForTokenClassification (config.json with id2label, model.safetensors, the
  tokenizer files); returns out_dir."""
  family, special, hf = task_models.hf_export_config(task_model, TOKEN_CLASSES, "tagging")
  labels = task_model.info.get("labels") or []
  hf.update(num_labels=len(labels), id2label={str(i): t for i, t in enumerate(labels)},
            label2id={t: i for i, t in enumerate(labels)})
  if family == "albert":
    hf["classifier_dropout_prob"] = hf["classifier_dropout"]
  params = jax.tree.map(np.asarray, task_model.params)
  tensors = convert.encoder_tensors(task_model.config, params, family, special)
  tensors.update(W.export_tensors(W.entries_of("classifier", "classifier"), params))
  return convert.write_dir(out_dir, hf, tensors, task_model.tokenizer)
