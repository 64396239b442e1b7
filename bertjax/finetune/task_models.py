"""Fine-tuned token-classification, multiple-choice and (ModernBERT) sequence-classification models on disk:
bertjax's own directory (what fine-tuning writes to WORKDIR/seed_S/model) and transformers'
`*ForTokenClassification` (BERT, RoBERTa, ALBERT, ELECTRA), `BertForMultipleChoice` and
`ModernBertForSequenceClassification` directories, in and out.

A bertjax task model is a single-model workdir (interop.workdir.write: config.json, the step-0 params
checkpoint) plus `task.json` (kind, labels, head dropout and the windowing that goes with the model).
"""

import dataclasses
import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.model import config as model_config
from bertjax.core.errors import UserError
from bertjax.finetune import tag_metrics
from bertjax.finetune.model import Classifier, MultipleChoice, TokenClassifier, load_model, restore_params
from bertjax.hf import configs, convert, modernbert as MB, safetensors_io, tokenizers as hf_tokenizers, weights as W
from bertjax.hf import workdir as wd

TASK_FILE = "task.json"
KINDS = ("tagging", "multiple_choice", "classification")
TOKEN_CLASSES = {"bert": "BertForTokenClassification", "roberta": "RobertaForTokenClassification",
                 "albert": "AlbertForTokenClassification", "electra": "ElectraForTokenClassification"}
CHOICE_CLASSES = {"bert": "BertForMultipleChoice"}
SEQUENCE_CLASSES = {"modernbert": "ModernBertForSequenceClassification"}
CLASSIFIER_FILE = "classifier.json"  # a fine-tuned sentence classifier (bertjax.finetune.model.save_model)


@dataclasses.dataclass
class TaskModel:
  """A fine-tuned task model: its kind, pretraining-style run config, deterministic flax module, params
  (embeddings, encoder, [pooler], classifier), tokenizer (or None) and task info (labels, windowing)."""

  kind: str
  config: object
  model: object
  params: dict
  tokenizer: object
  info: dict


def build(kind: str, run_config, info: dict, cfg=None):
  """The deterministic flax module of a task model from its run config and task info."""
  cfg = cfg or model_config.encoder_config(run_config.model)
  dropout = info.get("classifier_dropout", 0.1)
  if kind == "tagging":
    return TokenClassifier(cfg, len(info["labels"]), dropout, True, tuple(info["labels"]), info.get("scheme", ""))
  if kind == "multiple_choice":
    return MultipleChoice(cfg, 1, dropout, deterministic=True, head="pooler")
  if kind == "classification":
    return Classifier(cfg, info["num_outputs"], dropout, deterministic=True, head=info.get("head", "pooler"),
                      pooling=info.get("pooling", "cls"))
  raise UserError(f"task kind {kind!r}; bertjax saves {', '.join(KINDS)}")



def _copy_tokenizer(spec: str, directory: str) -> str:
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


def save(directory: str, kind: str, run_config, params, info: dict) -> None:
  """Writes a task model: config.json (the encoder's run config, its data.tokenizer naming a copy of the
  tokenizer in directory/tokenizer), the params checkpoint and task.json (`info` with the kind: labels,
  classifier_dropout, tag scheme; info["tokenizer"] is the spec of the tokenizer to copy)."""
  run_config, info = run_config.copy_and_resolve_references(), dict(info)
  run_config.data.tokenizer = _copy_tokenizer(info.pop("tokenizer", "") or run_config.data.tokenizer, directory)
  wd.write(directory, run_config, jax.tree.map(np.asarray, params), dict(task=kind))
  with open(os.path.join(directory, TASK_FILE), "w") as f:
    json.dump(dict(info, kind=kind), f, indent=2)


def load(directory: str) -> TaskModel:
  """A task model written by `save`, or a transformers *ForTokenClassification / BertForMultipleChoice
  directory (imported on the fly)."""
  path = os.path.join(directory, TASK_FILE)
  if os.path.isfile(os.path.join(directory, CLASSIFIER_FILE)):  # a fine-tuned sentence classifier
    with open(os.path.join(directory, CLASSIFIER_FILE)) as f:
      info = json.load(f)
    run_config, model, params = load_model(directory)
    spec = run_config.data.tokenizer
    return TaskModel("classification", run_config, model, params, hf_tokenizers.load_any(spec) if spec else None, info)
  if not os.path.isfile(path):
    hf_dir = not os.path.isdir(os.path.join(directory, "checkpoints"))
    if hf_dir and os.path.isfile(os.path.join(directory, "config.json")):
      return read_hf(directory)
    raise UserError(f"no fine-tuned task model at {directory!r} (no {TASK_FILE}); fine-tune with "
                    "--config.save_model=True (WORKDIR/seed_S/model) or pass an HF *ForTokenClassification directory")
  with open(path) as f:
    info = json.load(f)
  run_config = wd.load_config(directory)
  model = build(info["kind"], run_config, info)
  params = restore_params(directory, model)
  spec = run_config.data.tokenizer
  tok = hf_tokenizers.load_any(spec) if spec else None
  return TaskModel(info["kind"], run_config, model, params, tok, info)


def _kind_of(hf: dict, directory: str) -> str:
  archs = hf.get("architectures") or []
  if any(a.endswith("ForTokenClassification") for a in archs):
    return "tagging"
  if any(a.endswith("ForMultipleChoice") for a in archs):
    return "multiple_choice"
  if any(a.endswith("ForSequenceClassification") for a in archs):
    return "classification"
  raise UserError(f"{directory}/config.json names architectures {archs}; bertjax reads *ForTokenClassification "
                  "and BertForMultipleChoice task models")


def read_hf(hf_dir: str) -> TaskModel:
  """Imports a transformers *ForTokenClassification (BERT, RoBERTa, ALBERT, ELECTRA) or BertForMultipleChoice
  directory: the encoder through bertjax's importer, the task head (and pooler) from its tensors, the
  labels from id2label."""
  with open(os.path.join(hf_dir, "config.json")) as f:
    hf = json.load(f)
  kind = _kind_of(hf, hf_dir)
  imported = convert.read_hf(hf_dir)
  family = imported.family
  if kind == "multiple_choice" and family not in CHOICE_CLASSES:
    raise UserError(f"{family} multiple-choice models are not supported; bertjax reads BertForMultipleChoice")
  if kind == "classification" and family not in SEQUENCE_CLASSES:
    raise UserError(f"{family} sequence-classification directories are not read here; fine-tune from the checkpoint "
                    f"instead (bertjax reads {', '.join(SEQUENCE_CLASSES.values())})")
  tensors = convert._modern_names(safetensors_io.read_dir(hf_dir))
  params = {k: imported.params[k] for k in ("embeddings", "encoder")}
  entries = W.entries_of("classifier", "classifier")
  target = {"classifier": {"kernel": np.zeros(tuple(tensors["classifier.weight"].shape[::-1])),
                           "bias": np.zeros(tensors["classifier.bias"].shape)}}
  if kind in ("multiple_choice", "classification"):
    if imported.pooler is None:
      raise UserError(f"{hf_dir} has no pooler; a {hf.get('architectures')} checkpoint has one (bert.pooler.dense, "
                      "ModernBERT's head.dense and head.norm)")
    params["pooler"] = imported.pooler
  head, missing = W.import_tensors(entries, tensors, target)
  if missing:
    raise UserError(f"{hf_dir} lacks the task head's {missing[0]}")
  params.update(head)
  n = int(tensors["classifier.weight"].shape[0])
  id2label = hf.get("id2label") or {str(i): f"LABEL_{i}" for i in range(n)}
  labels = [id2label[str(i)] for i in range(n)]
  dropout = hf.get("classifier_dropout") or hf.get("classifier_dropout_prob") or hf.get("hidden_dropout_prob", 0.1)
  if family == "modernbert":  # its classifier_dropout is 0.0 by default, which `or` would skip
    dropout = hf.get("classifier_dropout", 0.0)
  scheme = tag_metrics.detect_scheme([labels]) if kind == "tagging" else ""
  info = dict(labels=labels if kind == "tagging" else [], scheme=scheme, classifier_dropout=float(dropout),
              family=family)
  if kind == "classification":
    info.update(num_outputs=n, head="modernbert", pooling=hf.get("classifier_pooling", "cls"))
  model = build(kind, imported.config, info)
  return TaskModel(kind, imported.config, model, jax.tree.map(jnp.asarray, params), imported.tokenizer, info)


def write_hf(task_model: TaskModel, out_dir: str, special=None) -> str:
  """Exports a task model as transformers' *ForTokenClassification or BertForMultipleChoice directory
  (config.json with id2label, model.safetensors, the tokenizer files); returns out_dir."""
  config, kind = task_model.config, task_model.kind
  family = configs.family_for(config)
  classes = {"tagging": TOKEN_CLASSES, "multiple_choice": CHOICE_CLASSES, "classification": SEQUENCE_CLASSES}[kind]
  if family not in classes:
    raise UserError(f"transformers has no {kind} class bertjax exports for {family}; export supports "
                    f"{', '.join(classes)}")
  tok = task_model.tokenizer
  special = special or (tok.special if tok is not None else convert.SpecialIds(0, 1, 2, 3, 4))
  hf = configs.to_hf(config, family, classes[family], special)
  labels = task_model.info.get("labels") or []
  if kind == "tagging":
    hf.update(num_labels=len(labels), id2label={str(i): t for i, t in enumerate(labels)},
              label2id={t: i for i, t in enumerate(labels)})
  hf["classifier_dropout"] = task_model.info.get("classifier_dropout", 0.1)
  if kind == "classification":
    n = task_model.info["num_outputs"]
    hf.update(num_labels=n, classifier_pooling=task_model.info.get("pooling", "cls"),
              problem_type="regression" if n == 1 else "single_label_classification")
  if family == "albert":
    hf["classifier_dropout_prob"] = hf["classifier_dropout"]
  params = jax.tree.map(np.asarray, task_model.params)
  tensors = convert.encoder_tensors(config, params, family, special)
  entries = W.entries_of("classifier", "classifier")
  if kind == "multiple_choice":
    entries += W.entries_of("pooler", W.PREFIX[family] + "pooler.dense")
  if kind == "classification":
    if task_model.info.get("head") != "modernbert":
      raise UserError(f"a classifier with the {task_model.info.get('head')!r} head has no {classes[family]} layout; "
                      "fine-tune with --config.model.head=modernbert (or auto)")
    entries = MB.classifier_head(model_config.encoder_config(config.model).use_bias)
  tensors.update(W.export_tensors(entries, params))
  return convert.write_dir(out_dir, hf, tensors, tok)
