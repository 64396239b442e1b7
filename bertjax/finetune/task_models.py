"""Fine-tuned token-classification, multiple-choice and sequence-classification models on disk: bertjax's own
directory (what fine-tuning writes to WORKDIR/seed_S/model) and transformers' `*ForTokenClassification`,
`*ForSequenceClassification` (BERT, RoBERTa, ALBERT, ELECTRA, ModernBERT) and `BertForMultipleChoice`
directories, in and out.

A bertjax task model is a single-model workdir (interop.workdir.write: config.json, the step-0 params
checkpoint) plus `task.json` (kind, labels, head dropout and the windowing that goes with the model); a
sequence classifier is finetune.model's (`classifier.json` instead of task.json: what compress.prune reads).
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
from bertjax.finetune import model as ft_model
from bertjax.finetune.model import Classifier, MultipleChoice, TokenClassifier, restore_params
from bertjax.hf import configs, convert, modernbert as MB, safetensors_io, tokenizers as hf_tokenizers, weights as W
from bertjax.hf import workdir as wd

TASK_FILE = "task.json"
KINDS = ("tagging", "multiple_choice", "classification")
TOKEN_CLASSES = {"bert": "BertForTokenClassification", "roberta": "RobertaForTokenClassification",
                 "albert": "AlbertForTokenClassification", "electra": "ElectraForTokenClassification"}
CHOICE_CLASSES = {"bert": "BertForMultipleChoice"}
SEQUENCE_CLASSES = {"bert": "BertForSequenceClassification", "roberta": "RobertaForSequenceClassification",
                    "albert": "AlbertForSequenceClassification", "electra": "ElectraForSequenceClassification",
                    "modernbert": "ModernBertForSequenceClassification",
                    "distilbert": "DistilBertForSequenceClassification"}
# The Classifier head each family's *ForSequenceClassification has (finetune.model.Classifier.head).
SEQUENCE_HEADS = {"bert": "pooler", "albert": "pooler", "roberta": "roberta", "electra": "electra",
                  "modernbert": "modernbert", "distilbert": "distilbert"}


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
  if kind == "classification":  # finetune.model's layout (classifier.json), which compress.prune reads too
    ft_model.save_model(directory, run_config, build(kind, run_config, info), params)
    return
  wd.write(directory, run_config, jax.tree.map(np.asarray, params), dict(task=kind))
  with open(os.path.join(directory, TASK_FILE), "w") as f:
    json.dump(dict(info, kind=kind), f, indent=2)


def load(directory: str) -> TaskModel:
  """A task model written by `save` (or a classifier by finetune.model.save_model), or a transformers
  *ForTokenClassification / *ForSequenceClassification / BertForMultipleChoice directory (imported on the fly)."""
  path = os.path.join(directory, TASK_FILE)
  if os.path.isfile(os.path.join(directory, "classifier.json")):  # finetune.model.save_model's classifier
    run_config, model, params = ft_model.load_model(directory)
    info = dict(head=model.head, num_outputs=model.num_outputs, classifier_dropout=model.classifier_dropout,
                pooling=model.pooling)
    return TaskModel("classification", run_config, model, params, _classifier_tokenizer(directory, run_config), info)
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


def _classifier_tokenizer(directory: str, run_config):
  """The tokenizer of a saved classifier: its config's data.tokenizer, else (fine-tuning's WORKDIR/seed_S/model)
  that of the checkpoint the fine-tuning workdir started from (its config.json's init.checkpoint), else None."""
  spec = run_config.data.get("tokenizer", "")
  if not spec:
    parent = os.path.join(directory, os.pardir, os.pardir, "config.json")
    checkpoint = ""
    if os.path.isfile(parent):
      with open(parent) as f:
        checkpoint = json.load(f).get("init", {}).get("checkpoint", "")
    if checkpoint and hf_tokenizers.has_tokenizer(checkpoint):
      return hf_tokenizers.from_dir(checkpoint)
    if checkpoint and os.path.isfile(os.path.join(checkpoint, "config.json")):
      spec = wd.load_config(checkpoint).data.get("tokenizer", "")
  return hf_tokenizers.load_any(spec) if spec else None


def _kind_of(hf: dict, directory: str) -> str:
  archs = hf.get("architectures") or []
  if any(a.endswith("ForTokenClassification") for a in archs):
    return "tagging"
  if any(a.endswith("ForMultipleChoice") for a in archs):
    return "multiple_choice"
  if any(a.endswith("ForSequenceClassification") for a in archs):
    return "classification"
  raise UserError(f"{directory}/config.json names architectures {archs}; bertjax reads *ForTokenClassification, "
                  "*ForSequenceClassification and BertForMultipleChoice task models")


def _sequence_head_entries(head: str, family: str, use_bias: bool = True) -> list:
  """The weight map of a *ForSequenceClassification head: BERT's / ALBERT's pooler and classifier,
  RoBERTa's and ELECTRA's classifier.dense and classifier.out_proj (bertjax's transform and classifier), or
  ModernBERT's head.dense, head.norm (bertjax's pooler) and classifier."""
  if head == "modernbert":
    return MB.classifier_head(use_bias)
  if head == "distilbert":  # pre_classifier (dim -> dim), then ReLU and the classifier, unprefixed
    return W.entries_of("pre_classifier", "pre_classifier") + W.entries_of("classifier", "classifier")
  if head == "pooler":
    pooler = W.PREFIX[family] + ("pooler" if family == "albert" else "pooler.dense")
    return W.entries_of("pooler", pooler) + W.entries_of("classifier", "classifier")
  return W.entries_of("transform", "classifier.dense") + W.entries_of("classifier", "classifier.out_proj")


def _read_sequence_classifier(hf_dir: str, hf: dict, imported, tensors: dict) -> TaskModel:
  """A *ForSequenceClassification directory as a Classifier task model with the family's own head."""
  family = imported.family
  if family not in SEQUENCE_HEADS:
    raise UserError(f"{family} sequence classifiers are not supported; bertjax reads {', '.join(SEQUENCE_CLASSES.values())}")
  head = SEQUENCE_HEADS[family]
  out = "classifier.out_proj.weight" if head in ("roberta", "electra") else "classifier.weight"
  if out not in tensors:
    raise UserError(f"{hf_dir} lacks the sequence-classification head's {out}")
  n, hidden = int(tensors[out].shape[0]), imported.config.model.hidden_size
  square = {"kernel": np.zeros((hidden, hidden)), "bias": np.zeros(hidden)}
  target = {"pooler": square, "transform": square, "pre_classifier": square,
            "classifier": {"kernel": np.zeros((hidden, n)), "bias": np.zeros(n)}}
  entries = _sequence_head_entries(head, family)
  if head == "modernbert":  # its head.dense and head.norm come with the encoder (imported.pooler)
    entries, target = W.entries_of("classifier", "classifier"), {"classifier": target["classifier"]}
  params, missing = W.import_tensors(entries, tensors, target)
  if missing:
    raise UserError(f"{hf_dir} lacks the sequence-classification head's {missing[0]}")
  params.update({k: imported.params[k] for k in ("embeddings", "encoder")})
  dropout = hf.get("classifier_dropout") or hf.get("classifier_dropout_prob") or hf.get("hidden_dropout_prob", 0.1)
  info = {}
  if head == "modernbert":
    if imported.pooler is None:
      raise UserError(f"{hf_dir} lacks ModernBERT's classification head (head.dense, head.norm)")
    params["pooler"] = imported.pooler
    dropout = hf.get("classifier_dropout", 0.0)  # 0.0 by default, which `or` would skip
    info["pooling"] = hf.get("classifier_pooling", "cls")
  if head == "distilbert":
    dropout = hf.get("seq_classif_dropout", 0.2)
  id2label = hf.get("id2label") or {}
  info.update(head=head, num_outputs=n, classifier_dropout=float(dropout), family=family,
              labels=[id2label.get(str(i), f"LABEL_{i}") for i in range(n)] if n > 1 else [])
  model = build("classification", imported.config, info)
  return TaskModel("classification", imported.config, model, jax.tree.map(jnp.asarray, params), imported.tokenizer, info)


def read_hf(hf_dir: str) -> TaskModel:
  """Imports a transformers *ForTokenClassification (BERT, RoBERTa, ALBERT, ELECTRA) or BertForMultipleChoice
  directory: the encoder through bertjax's importer, the task head (and pooler) from its tensors, the
  labels from id2label."""
  with open(os.path.join(hf_dir, "config.json")) as f:
    hf = json.load(f)
  kind = _kind_of(hf, hf_dir)
  imported = convert.read_hf(hf_dir)
  family = imported.family
  if kind == "classification":
    return _read_sequence_classifier(hf_dir, hf, imported, convert._modern_names(safetensors_io.read_dir(hf_dir)))
  if kind == "multiple_choice" and family not in CHOICE_CLASSES:
    raise UserError(f"{family} multiple-choice models are not supported; bertjax reads BertForMultipleChoice")
  tensors = convert._modern_names(safetensors_io.read_dir(hf_dir))
  params = {k: imported.params[k] for k in ("embeddings", "encoder")}
  entries = W.entries_of("classifier", "classifier")
  target = {"classifier": {"kernel": np.zeros(tuple(tensors["classifier.weight"].shape[::-1])),
                           "bias": np.zeros(tensors["classifier.bias"].shape)}}
  if kind == "multiple_choice":
    if imported.pooler is None:
      raise UserError(f"{hf_dir} has no pooler; a {hf.get('architectures')} checkpoint has one (bert.pooler.dense)")
    params["pooler"] = imported.pooler
  head, missing = W.import_tensors(entries, tensors, target)
  if missing:
    raise UserError(f"{hf_dir} lacks the task head's {missing[0]}")
  params.update(head)
  n = int(tensors["classifier.weight"].shape[0])
  id2label = hf.get("id2label") or {str(i): f"LABEL_{i}" for i in range(n)}
  labels = [id2label[str(i)] for i in range(n)]
  dropout = hf.get("classifier_dropout") or hf.get("classifier_dropout_prob") or hf.get("hidden_dropout_prob", 0.1)
  scheme = tag_metrics.detect_scheme([labels]) if kind == "tagging" else ""
  info = dict(labels=labels if kind == "tagging" else [], scheme=scheme, classifier_dropout=float(dropout),
              family=family)
  model = build(kind, imported.config, info)
  return TaskModel(kind, imported.config, model, jax.tree.map(jnp.asarray, params), imported.tokenizer, info)


def write_hf(task_model: TaskModel, out_dir: str, special=None) -> str:
  """Exports a task model as transformers' *ForTokenClassification, *ForSequenceClassification or
  BertForMultipleChoice directory (config.json with id2label, model.safetensors, the tokenizer files);
  returns out_dir."""
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
  if kind == "classification":
    head, n = task_model.info["head"], task_model.info["num_outputs"]
    if head != SEQUENCE_HEADS[family]:
      raise UserError(f"{SEQUENCE_CLASSES[family]} has the {SEQUENCE_HEADS[family]} head; this model was "
                      f"fine-tuned with model.head={head}, which it cannot hold")
    names = labels or [f"LABEL_{i}" for i in range(n)]
    hf.update(num_labels=n, id2label={str(i): t for i, t in enumerate(names)}, label2id={t: i for i, t in enumerate(names)},
              problem_type="regression" if n == 1 else "single_label_classification")
  hf["classifier_dropout"] = task_model.info.get("classifier_dropout", 0.1)
  if kind == "classification" and family == "modernbert":
    hf["classifier_pooling"] = task_model.info.get("pooling", "cls")
  if kind == "classification" and family == "distilbert":
    hf["seq_classif_dropout"] = hf["classifier_dropout"]
  if family == "albert":
    hf["classifier_dropout_prob"] = hf["classifier_dropout"]
  params = jax.tree.map(np.asarray, task_model.params)
  tensors = convert.encoder_tensors(config, params, family, special)
  entries = W.entries_of("classifier", "classifier")
  if kind == "multiple_choice":
    entries += W.entries_of("pooler", W.PREFIX[family] + "pooler.dense")
  if kind == "classification":
    entries = _sequence_head_entries(task_model.info["head"], family,
                                     model_config.encoder_config(config.model).use_bias)
  tensors.update(W.export_tensors(entries, params))
  return convert.write_dir(out_dir, hf, tensors, tok)
