"""Fine-tuned task models in and out of transformers: *ForTokenClassification (BERT, RoBERTa, ALBERT,
ELECTRA) and BertForMultipleChoice made at random in the test, imported (same logits within 1e-4),
exported back (transformers loads it and agrees), and saved/loaded as bertjax task models."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import numpy as np
import pytest

from bertjax.finetune import task_models
from bertjax.finetune.classification.hf import SEQUENCE_CLASSES, SEQUENCE_HEADS
from bertjax.finetune.multiple_choice import task as multiple_choice
from bertjax.finetune.tagging.hf import TOKEN_CLASSES

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
TOL = 1e-4
SIZES = dict(vocab_size=120, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=48,
             max_position_embeddings=64, hidden_act="gelu")
FAMILIES = {"bert": {}, "roberta": dict(pad_token_id=1, bos_token_id=0, eos_token_id=2),
            "albert": dict(embedding_size=16, num_hidden_groups=1, hidden_act="gelu_new"),
            "electra": dict(embedding_size=16)}


def _inputs(seed=0, b=3, s=20):
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, SIZES["vocab_size"], (b, s))
  mask = (np.arange(s)[None] < (s - np.arange(b)[:, None] * 4 % 11)).astype(np.int64)
  types = (np.arange(s)[None] >= 8).astype(np.int64).repeat(b, 0) * mask
  return ids, types, mask


def _ours(tm, ids, types, mask):
  return np.asarray(tm.model.apply({"params": tm.params}, ids.astype(np.int32), types.astype(np.int32),
                                   mask.astype(np.int32)))


def _random_hf(cls, config, seed):
  torch.manual_seed(seed)
  model = cls(config).eval()
  with torch.no_grad():  # LayerNorms and biases away from 1 and 0, so a mix-up shows
    for name, p in model.named_parameters():
      if name.endswith("bias") or "LayerNorm" in name or "layer_norm" in name:
        p.add_(torch.randn_like(p) * 0.1)
  return model


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_token_classification_imports_and_exports_with_transformers_logits(family, tmp_path):
  config = transformers.AutoConfig.for_model(family, **{**SIZES, **FAMILIES[family]}, num_labels=5,
                                             id2label={i: t for i, t in enumerate("O B-A I-A B-B I-B".split())})
  hf = _random_hf(transformers.AutoModelForTokenClassification.from_config(config).__class__, config, 0)
  hf.save_pretrained(tmp_path / "hf")
  ids, types, mask = _inputs()
  if family == "roberta":
    types = np.zeros_like(types)  # RoBERTa has one segment type
  with torch.no_grad():
    theirs = hf(torch.tensor(ids), attention_mask=torch.tensor(mask), token_type_ids=torch.tensor(types)).logits.numpy()
  tm = task_models.load(str(tmp_path / "hf"))  # an HF directory is imported on the fly
  assert tm.kind == "tagging" and tm.info["labels"] == ["O", "B-A", "I-A", "B-B", "I-B"]
  real = mask > 0
  assert np.abs(_ours(tm, ids, types, mask)[real] - theirs[real]).max() < TOL
  # Export and load in transformers: the same class, the same logits.
  task_models.write_hf(tm, str(tmp_path / "out"))
  back = transformers.AutoModelForTokenClassification.from_pretrained(tmp_path / "out").eval()
  assert type(back).__name__ == TOKEN_CLASSES[family]
  assert back.config.id2label[1] == "B-A"
  with torch.no_grad():
    again = back(torch.tensor(ids), attention_mask=torch.tensor(mask),
                 token_type_ids=torch.tensor(types)).logits.numpy()
  assert np.abs(again[real] - theirs[real]).max() < TOL
  # bertjax's own task-model directory round-trips.
  task_models.save(str(tmp_path / "bjx"), tm.kind, tm.config, tm.params, tm.info)
  saved = task_models.load(str(tmp_path / "bjx"))
  np.testing.assert_allclose(_ours(saved, ids, types, mask), _ours(tm, ids, types, mask), atol=1e-6)


def test_multiple_choice_imports_and_exports_with_transformers_logits(tmp_path):
  config = transformers.BertConfig(**SIZES)
  hf = _random_hf(transformers.BertForMultipleChoice, config, 1)
  hf.save_pretrained(tmp_path / "hf")
  ids, types, mask = _inputs(1, b=4)
  shape = (2, 2, ids.shape[1])  # 2 examples x 2 choices
  t = lambda x: torch.tensor(x.reshape(shape))
  with torch.no_grad():
    theirs = hf(t(ids), attention_mask=t(mask), token_type_ids=t(types)).logits.numpy()
  tm = task_models.load(str(tmp_path / "hf"))
  assert tm.kind == "multiple_choice"
  batch = dict(input_ids=ids.reshape(shape), type_ids=types.reshape(shape), groups=mask.reshape(shape),
               choice_mask=np.ones(shape[:2], np.float32))
  ours = np.asarray(multiple_choice.choice_logits(tm.params, batch, tm.model))
  assert ours.shape == (2, 2) and np.abs(ours - theirs).max() < TOL
  task_models.write_hf(tm, str(tmp_path / "out"))
  back = transformers.BertForMultipleChoice.from_pretrained(tmp_path / "out").eval()
  with torch.no_grad():
    again = back(t(ids), attention_mask=t(mask), token_type_ids=t(types)).logits.numpy()
  assert np.abs(again - theirs).max() < TOL


@pytest.mark.parametrize("family", ["roberta"] + [pytest.param(f, marks=pytest.mark.slow)
                                                  for f in ("albert", "bert", "electra")])
def test_sequence_classification_imports_and_exports_with_transformers_logits(family, tmp_path):
  """*ForSequenceClassification with the family's own head (RoBERTa: dense, tanh, out_proj on <s>, no pooler;
  BERT and ALBERT: the pooler; ELECTRA: dense, GELU, out_proj) in, out, and as bertjax's classifier directory."""
  config = transformers.AutoConfig.for_model(family, **{**SIZES, **FAMILIES[family]}, num_labels=3)
  hf = _random_hf(transformers.AutoModelForSequenceClassification.from_config(config).__class__, config, 2)
  hf.save_pretrained(tmp_path / "hf")
  ids, types, mask = _inputs(2)
  if family == "roberta":
    types = np.zeros_like(types)
  run = lambda m: m(torch.tensor(ids), attention_mask=torch.tensor(mask), token_type_ids=torch.tensor(types)).logits
  with torch.no_grad():
    theirs = run(hf).numpy()
  tm = task_models.load(str(tmp_path / "hf"))
  assert tm.kind == "classification" and tm.model.head == SEQUENCE_HEADS[family]
  if family == "roberta":
    assert "pooler" not in tm.params and sorted(tm.params["transform"]) == ["bias", "kernel"]
  assert np.abs(_ours(tm, ids, types, mask) - theirs).max() < TOL
  task_models.write_hf(tm, str(tmp_path / "out"))
  back = transformers.AutoModelForSequenceClassification.from_pretrained(tmp_path / "out").eval()
  assert type(back).__name__ == SEQUENCE_CLASSES[family]
  with torch.no_grad():
    assert np.abs(run(back).numpy() - theirs).max() < TOL
  if family == "roberta":
    return  # the normal tier's time budget; the directory round trip below is the same code for every family
  # bertjax's classifier directory (classifier.json: what fine-tuning saves and compress.prune reads)
  task_models.save(str(tmp_path / "bjx"), tm.kind, tm.config, tm.params, tm.info)
  assert os.path.isfile(tmp_path / "bjx" / "classifier.json")
  saved = task_models.load(str(tmp_path / "bjx"))
  np.testing.assert_allclose(_ours(saved, ids, types, mask), _ours(tm, ids, types, mask), atol=1e-6)


def test_auto_head_is_the_checkpoint_family_s_own():
  """model.head=auto: RoBERTa checkpoints fine-tune with RobertaForSequenceClassification's head, ELECTRA's
  with ElectraForSequenceClassification's, the rest with BERT's pooler head."""
  import types

  from bertjax.finetune.classification import task as classification
  from conftest import load_config

  config = load_config("configs/finetune.py:tiny")
  assert config.model.head == "auto"
  kinds = {spec: classification.head_kind(config, types.SimpleNamespace(config=load_config(f"configs/{spec}.py:tiny")))
           for spec in ("bert", "roberta", "electra", "albert", "lite", "tree")}
  assert kinds == {"bert": "pooler", "roberta": "roberta", "electra": "electra", "albert": "pooler", "lite": "pooler",
                   "tree": "pooler"}  # kinds of no transformers family: BERT's
