"""Fine-tuning step parity for the token-classification and multiple-choice families: bertjax's step (the
trainer's train_step with the task module's model and loss) against transformers' BertForTokenClassification
(ignored positions: first-subword-only labels and padding, label -100 there) and BertForMultipleChoice, from
the same weights on the same batches, dropout off, float32, 20 steps: per-step loss within 1e-3 relative."""

import functools
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bertjax.model import config as model_config
from bertjax.data.tokenizer import SPM_SPECIAL as SPECIAL
from bertjax.finetune import train as ft
from bertjax.finetune.model import init_params
from bertjax.finetune.multiple_choice import task as multiple_choice
from bertjax.finetune.multiple_choice.model import MultipleChoice
from bertjax.finetune.tagging import task as tagging
from bertjax.finetune.tagging.model import TokenClassifier
from bertjax.hf import convert
from conftest import load_config, micro

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import torch_reference as ref  # noqa: E402
from test_finetune_parity import random_params  # noqa: E402  (BERT-style init drawn with NumPy)

STEPS, LOSS_RTOL, LABELS = 20, 1e-3, 5


def _tokens(rng, b, s, vocab):
  """[CLS] tokens [SEP] rows of random lengths, padded: (ids, groups)."""
  lengths = rng.integers(s // 2, s + 1, b)
  ids = rng.integers(5, vocab, (b, s)).astype(np.int32)
  ids[:, 0] = SPECIAL.cls
  ids[np.arange(b), lengths - 1] = SPECIAL.sep
  groups = (np.arange(s)[None] < lengths[:, None]).astype(np.int32)
  return np.where(groups > 0, ids, SPECIAL.pad), groups


def tag_batches(vocab, b=8, s=24):
  """Token batches whose labels sit on "first subwords" only (a random 60% of the real non-special
  positions); the rest (continuations, specials, padding) are ignored: weight 0 here, -100 for HF."""
  for t in range(STEPS):
    rng = np.random.default_rng(t % 2)
    ids, groups = _tokens(rng, b, s, vocab)
    inner = (groups > 0) & (ids != SPECIAL.cls) & (ids != SPECIAL.sep)
    weight = (inner & (rng.random((b, s)) < 0.6)).astype(np.float32)
    tag = (ids % LABELS).astype(np.int32) * (weight > 0)
    yield dict(input_ids=ids, type_ids=np.zeros_like(ids), groups=groups, tag=tag, tag_weight=weight,
               example_weight=np.ones(b, np.float32))


def choice_batches(vocab, b=4, c=3, s=16):
  """[B, C, S] pair batches; the label is a function of the first choice's tokens."""
  for t in range(STEPS):
    rng = np.random.default_rng(t % 2)
    ids, groups = _tokens(rng, b * c, s, vocab)
    types = ((np.arange(s)[None] > s // 3) * groups).astype(np.int32)
    shape = (b, c, s)
    label = (ids.reshape(shape)[:, 0, 1] % c).astype(np.int32)
    yield dict(input_ids=ids.reshape(shape), type_ids=types.reshape(shape), groups=groups.reshape(shape),
               choice_mask=np.ones((b, c), np.float32), label=label, example_weight=np.ones(b, np.float32))


def _setup(tmp_path):
  pre = micro("configs/bert.py:tiny")
  pre.model.vocab_size = 300
  pre.model.dropout = pre.model.attention_dropout = 0.0
  pretrained = random_params(pre)
  dirs = convert.write_hf(pre, pretrained, str(tmp_path / "hf"), special=SPECIAL)
  config = load_config("configs/finetune.py:ner")
  config.model.classifier_dropout = 0.0
  return pre, pretrained, dirs, config


def _run(task, model, params, enc, config, hf, batches, hf_inputs):
  """Both sides' per-step losses over `batches`, ours through the trainer's train_step."""
  tx = ft.make_tx(config, params, enc, STEPS, 4)
  step = jax.jit(functools.partial(ft.train_step, model=model, tx=tx, task_loss=task.loss))
  hf = ref.reference_semantics(hf)
  view = ml_collections.ConfigDict(dict(learning_rate=config.learning_rate, warmup_steps=4, total_steps=STEPS,
                                        optimizer=config.optimizer.to_dict()))
  opt, sched, torch_params = ref.adamw(view, [hf])
  state = tx.init(params)
  ours, theirs = [], []
  for t, batch in enumerate(batches):
    params, state, loss = step(params, state, batch, jnp.uint32(0), jnp.int32(t))
    ours.append(float(loss))
    theirs.append(ref.train_step(hf(**hf_inputs(batch)).loss, opt, sched, torch_params, config.optimizer.clip_norm))
  return ours, theirs


def test_token_classification_steps_match_transformers(tmp_path):
  pre, pretrained, dirs, config = _setup(tmp_path)
  config.learning_rate = 1e-3  # large enough that 20 steps move the loss visibly
  enc = model_config.encoder_config(pre.model)
  model = TokenClassifier(enc, LABELS, 0.0, deterministic=False)
  params, fresh = init_params(model, jax.random.key(3), pretrained, None)
  assert fresh == ["classifier"]
  hf = transformers.BertForTokenClassification.from_pretrained(dirs[0], num_labels=LABELS, attn_implementation="eager")
  ref.copy_heads(hf, params, {"classifier": "classifier"})

  def hf_inputs(batch):
    labels = np.where(batch["tag_weight"] > 0, batch["tag"], -100)
    return dict(input_ids=ref.long(batch["input_ids"]), attention_mask=ref.long(batch["groups"]),
                token_type_ids=ref.long(batch["type_ids"]), labels=ref.long(labels))

  ours, theirs = _run(tagging, model, params, enc, config, hf, tag_batches(pre.model.vocab_size), hf_inputs)
  np.testing.assert_allclose(ours, theirs, rtol=LOSS_RTOL)
  assert np.mean(theirs[-5:]) < np.mean(theirs[:5])  # it learned


def test_multiple_choice_steps_match_transformers(tmp_path):
  pre, pretrained, dirs, config = _setup(tmp_path)
  config.learning_rate = 1e-3
  enc = model_config.encoder_config(pre.model)
  model = MultipleChoice(enc, 1, 0.0, deterministic=False, head="pooler")
  params, fresh = init_params(model, jax.random.key(3), pretrained, pretrained["sentence"]["pooler"])
  assert fresh == ["classifier"]
  hf = transformers.BertForMultipleChoice.from_pretrained(dirs[0], attn_implementation="eager")
  ref.copy_heads(hf, params, {"classifier": "classifier"})

  def hf_inputs(batch):
    return dict(input_ids=ref.long(batch["input_ids"]), attention_mask=ref.long(batch["groups"]),
                token_type_ids=ref.long(batch["type_ids"]), labels=ref.long(batch["label"]))

  ours, theirs = _run(multiple_choice, model, params, enc, config, hf, choice_batches(pre.model.vocab_size), hf_inputs)
  np.testing.assert_allclose(ours, theirs, rtol=LOSS_RTOL)
  assert np.mean(theirs[-5:]) < np.mean(theirs[:5])
