"""The classification family's models on disk: a fine-tuned Classifier's directory (classifier.json; what
bertjax.compress.prune reads too) and transformers' *ForSequenceClassification (BERT, RoBERTa, ALBERT,
ELECTRA, ModernBERT, DistilBERT, MobileBERT), each family with its own head, in and out."""

import json
import os

import jax
import numpy as np

from bertjax.core.errors import UserError
from bertjax.finetune import task_models
from bertjax.finetune.classification import model as cls_model
from bertjax.finetune.task_models import TaskModel
from bertjax.hf import convert, mobilebert as MOB, modernbert as MB, safetensors_io, tokenizers as hf_tokenizers
from bertjax.hf import weights as W
from bertjax.hf import workdir as wd
from bertjax.hf.inference import on_device
from bertjax.model import config as model_config

MODEL_FILE = "classifier.json"
HF_SUFFIXES = ("ForSequenceClassification",)
SEQUENCE_CLASSES = {"bert": "BertForSequenceClassification", "roberta": "RobertaForSequenceClassification",
                    "albert": "AlbertForSequenceClassification", "electra": "ElectraForSequenceClassification",
                    "modernbert": "ModernBertForSequenceClassification",
                    "distilbert": "DistilBertForSequenceClassification",
                    "mobilebert": "MobileBertForSequenceClassification"}
# The Classifier head each family's *ForSequenceClassification has (classification.model.Classifier.head).
SEQUENCE_HEADS = {"bert": "pooler", "albert": "pooler", "roberta": "roberta", "electra": "electra",
                  "modernbert": "modernbert", "distilbert": "distilbert", "mobilebert": "pooler"}


def build(run_config, info: dict, cfg=None) -> cls_model.Classifier:
  """The deterministic Classifier of a task model from its run config and info (head, outputs, pooling)."""
  cfg = cfg or model_config.encoder_config(run_config.model)
  return cls_model.Classifier(cfg, info["num_outputs"], info.get("classifier_dropout", 0.1), deterministic=True,
                              head=info.get("head", "pooler"), pooling=info.get("pooling", "cls"))


def save(directory: str, run_config, params, info: dict) -> None:
  """classification.model.save_model's layout (classifier.json), which compress.prune reads too."""
  cls_model.save_model(directory, run_config, build(run_config, info), params)


def load(directory: str) -> TaskModel:
  """A classifier written by `save` (or a seed's save_model)."""
  run_config, model, params = cls_model.load_model(directory)
  info = dict(head=model.head, num_outputs=model.num_outputs, classifier_dropout=model.classifier_dropout,
              pooling=model.pooling)
  return TaskModel("classification", run_config, model, params, _classifier_tokenizer(directory, run_config), info)


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


def _pooler_name(family: str) -> str:
  if family == "mobilebert":
    return MOB.PREFIX + "pooler.dense"
  return W.PREFIX[family] + ("pooler" if family == "albert" else "pooler.dense")


def _sequence_head_entries(head: str, family: str, use_bias: bool = True, pooler: bool = True) -> list:
  """The weight map of a *ForSequenceClassification head: BERT's / ALBERT's / MobileBERT's pooler (unless the
  model has none: MobileBERT's classifier_activation false, `pooler` False) and classifier, RoBERTa's and
  ELECTRA's classifier.dense and classifier.out_proj (bertjax's transform and classifier), or ModernBERT's
  head.dense, head.norm (bertjax's pooler) and classifier."""
  if head == "modernbert":
    return MB.classifier_head(use_bias)
  if head == "distilbert":  # pre_classifier (dim -> dim), then ReLU and the classifier, unprefixed
    return W.entries_of("pre_classifier", "pre_classifier") + W.entries_of("classifier", "classifier")
  if head == "pooler":
    return (W.entries_of("pooler", _pooler_name(family)) if pooler else []) + W.entries_of("classifier", "classifier")
  return W.entries_of("transform", "classifier.dense") + W.entries_of("classifier", "classifier.out_proj")


def read_hf(hf_dir: str) -> TaskModel:
  """A *ForSequenceClassification directory as a Classifier task model with the family's own head."""
  with open(os.path.join(hf_dir, "config.json")) as f:
    hf = json.load(f)
  imported = convert.read_hf(hf_dir)
  tensors = convert._modern_names(safetensors_io.read_dir(hf_dir))
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
  entries = _sequence_head_entries(head, family, pooler=imported.config.model.get("pooler_activation", True))
  if head == "modernbert":  # its head.dense and head.norm come with the encoder (imported.pooler)
    entries, target = W.entries_of("classifier", "classifier"), {"classifier": target["classifier"]}
  params, missing = W.import_tensors(entries, tensors, target)
  if missing:
    raise UserError(f"{hf_dir} lacks the sequence-classification head's {missing[0]}")
  params.update({k: imported.params[k] for k in ("embeddings", "encoder")})
  dropout = task_models.hf_dropout(hf)
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
  model = build(imported.config, info)
  return TaskModel("classification", imported.config, model, on_device(params), imported.tokenizer, info)


def write_hf(task_model: TaskModel, out_dir: str) -> str:
  """Exports a classifier as its family's *ForSequenceClassification (config.json with id2label, problem_type;
  model.safetensors; the tokenizer files); returns out_dir."""
  config = task_model.config
  family, special, hf = task_models.hf_export_config(task_model, SEQUENCE_CLASSES, "classification")
  head, n = task_model.info["head"], task_model.info["num_outputs"]
  if head != SEQUENCE_HEADS[family]:
    raise UserError(f"{SEQUENCE_CLASSES[family]} has the {SEQUENCE_HEADS[family]} head; this model was "
                    f"fine-tuned with model.head={head}, which it cannot hold")
  names = task_model.info.get("labels") or [f"LABEL_{i}" for i in range(n)]
  hf.update(num_labels=n, id2label={str(i): t for i, t in enumerate(names)}, label2id={t: i for i, t in enumerate(names)},
            problem_type="regression" if n == 1 else "single_label_classification")
  if family == "modernbert":
    hf["classifier_pooling"] = task_model.info.get("pooling", "cls")
  if family == "distilbert":
    hf["seq_classif_dropout"] = hf["classifier_dropout"]
  if family == "albert":
    hf["classifier_dropout_prob"] = hf["classifier_dropout"]
  params = jax.tree.map(np.asarray, task_model.params)
  tensors = convert.encoder_tensors(config, params, family, special)
  entries = _sequence_head_entries(head, family, model_config.encoder_config(config.model).use_bias,
                                   config.model.get("pooler_activation", True))
  tensors.update(W.export_tensors(entries, params))
  return convert.write_dir(out_dir, hf, tensors, task_model.tokenizer)
