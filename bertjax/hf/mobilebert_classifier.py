"""MobileBertForSequenceClassification in and out: the encoder through bertjax's importer (bertjax.hf.convert), and
the head as the params of bertjax's sentence head (bertjax.model.heads.SentenceHead with `classes` = num_labels):
the pooler when the config's classifier_activation has one (read from the config, never the class default), and
the classifier. Dropout aside, SentenceHead(cfg, classes) over the encoder's output computes the HF logits."""

import numpy as np

from bertjax.core.errors import UserError
from bertjax.hf import configs, convert, mobilebert as MOB, safetensors_io, weights as W


def read_classifier(hf_dir: str, seed: int = 0):
  """(convert.Imported, head params {"pooler"?, "classifier"}) of a MobileBertForSequenceClassification directory."""
  imported = convert.read_hf(hf_dir, seed=seed)
  if imported.family != "mobilebert":
    raise UserError(f"{hf_dir} holds a {imported.family} model; read_classifier reads MobileBERT classifiers")
  tensors = safetensors_io.read_dir(hf_dir)
  if "classifier.weight" not in tensors:
    raise UserError(f"{hf_dir} has no classifier.weight; is it a MobileBertForSequenceClassification?")
  n, hidden = tensors["classifier.weight"].shape
  target = {"classifier": {"kernel": np.zeros((hidden, n)), "bias": np.zeros(n)}}
  head, _ = W.import_tensors(W.entries_of("classifier", "classifier"), tensors, target)
  if imported.config.model.pooler_activation:
    if imported.pooler is None:
      raise UserError(f"{hf_dir} has classifier_activation true but no pooler weights")
    head["pooler"] = imported.pooler
  return imported, head


def write_classifier(config, params, head, out_dir: str, tokenizer=None, special=None) -> str:
  """Writes a MobileBertForSequenceClassification directory from Pretrainer-layout `params` (embeddings, encoder)
  and the sentence head's `head` params; returns the directory."""
  from bertjax.data.tokenizer import SpecialIds

  special = special or (tokenizer.special if tokenizer else SpecialIds(0, 1, 2, 3, 4))
  if configs.family_for(config) != "mobilebert":
    raise UserError("write_classifier exports MobileBERT models (model.layer=mobilebert, norm=nonorm)")
  n = int(np.asarray(head["classifier"]["bias"]).shape[0])
  hf = configs.to_hf(config, "mobilebert", "MobileBertForSequenceClassification", special)
  hf.update(id2label={str(i): f"LABEL_{i}" for i in range(n)}, label2id={f"LABEL_{i}": i for i in range(n)})
  tensors = convert.encoder_tensors(config, params, "mobilebert", special)
  entries = W.entries_of("classifier", "classifier")
  if config.model.pooler_activation:
    entries += W.entries_of("pooler", MOB.PREFIX + "pooler.dense")
  tensors.update(W.export_tensors(entries, head))
  return convert.write_dir(out_dir, hf, tensors, tokenizer)
