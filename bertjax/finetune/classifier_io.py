"""Fine-tuned sentence classifiers as transformers directories: DistilBertForSequenceClassification in and out
(the encoder through bertjax.hf's importer and exporter, the pre_classifier + ReLU + classifier head as
bertjax's `distilbert` Classifier head).

A classifier fine-tuned with --config.save_model=True (WORKDIR/seed_S/model, read by finetune.model.load_model)
exports with `write_hf(*load_model(DIR), OUT)`; `read_hf(DIR)` gives the same (run config, Classifier, params).
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.core.errors import UserError
from bertjax.data.tokenizer import SpecialIds
from bertjax.finetune.model import Classifier
from bertjax.hf import configs, convert, safetensors_io, weights as W
from bertjax.model import config as model_config

CLASSES = {"distilbert": "DistilBertForSequenceClassification"}  # family -> transformers class
HEAD_OF = {"distilbert": "distilbert"}  # family -> the Classifier head that class has


def _head_entries(family: str) -> list:
  del family  # DistilBERT's head: pre_classifier (dim -> dim) and classifier (dim -> num_labels), unprefixed
  return W.entries_of("pre_classifier", "pre_classifier") + W.entries_of("classifier", "classifier")


def read_hf(hf_dir: str) -> tuple:
  """(run config, deterministic Classifier, params, tokenizer or None) of a transformers
  DistilBertForSequenceClassification directory."""
  with open(os.path.join(hf_dir, "config.json")) as f:
    hf = json.load(f)
  archs = hf.get("architectures") or []
  if not any(a in CLASSES.values() for a in archs):
    raise UserError(f"{hf_dir}/config.json names architectures {archs}; bertjax reads "
                    f"{', '.join(CLASSES.values())} sentence classifiers")
  imported = convert.read_hf(hf_dir)
  tensors = convert._modern_names(safetensors_io.read_dir(hf_dir))
  if "classifier.weight" not in tensors:
    raise UserError(f"{hf_dir} lacks the classifier head's classifier.weight")
  n, hidden = (int(d) for d in tensors["classifier.weight"].shape)
  target = {"pre_classifier": {"kernel": np.zeros((hidden, hidden)), "bias": np.zeros(hidden)},
            "classifier": {"kernel": np.zeros((hidden, n)), "bias": np.zeros(n)}}
  head, missing = W.import_tensors(_head_entries(imported.family), tensors, target)
  if missing:
    raise UserError(f"{hf_dir} lacks the classifier head's {missing[0]}")
  params = {k: imported.params[k] for k in ("embeddings", "encoder")} | head
  model = Classifier(model_config.encoder_config(imported.config.model), n, float(hf.get("seq_classif_dropout", 0.2)),
                     deterministic=True, head=HEAD_OF[imported.family])
  return imported.config, model, jax.tree.map(jnp.asarray, params), imported.tokenizer


def write_hf(run_config, model: Classifier, params, out_dir: str, tokenizer=None) -> str:
  """Writes a fine-tuned Classifier as its transformers class (config.json with num_labels, model.safetensors,
  the tokenizer files); returns out_dir."""
  family = configs.family_for(run_config)
  if family not in CLASSES or model.head != HEAD_OF[family]:
    raise UserError(f"bertjax exports {', '.join(CLASSES.values())} (a {family} encoder with the {model.head} head "
                    "has no transformers class here)")
  special = tokenizer.special if tokenizer is not None else SpecialIds(0, 1, 2, 3, 4)
  hf = configs.to_hf(run_config, family, CLASSES[family], special)
  labels = [f"LABEL_{i}" for i in range(model.num_outputs)]
  hf.update(seq_classif_dropout=model.classifier_dropout, id2label=dict(enumerate(labels)),
            label2id={t: i for i, t in enumerate(labels)})
  if model.num_outputs == 1:
    hf["problem_type"] = "regression"
  params = jax.tree.map(np.asarray, params)
  tensors = convert.encoder_tensors(run_config, params, family, special)
  tensors.update(W.export_tensors(_head_entries(family), params))
  return convert.write_dir(out_dir, hf, tensors, tokenizer)
