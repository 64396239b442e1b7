"""SQuAD step parity with transformers: bertjax's fine-tuning step with the span head and loss (as
`python -m bertjax.finetune --config=configs/finetune.py:squad2` builds them) and BertForQuestionAnswering,
from the same weights on the same batches (windows labeled at [CLS] among them), dropout off, float32:
per-step loss to 1e-3 relative over 20 steps, final parameters to 1e-3. transformers' loss keeps padding
positions in the softmax, whose logits differ by design (qa_model.PADDING_LOGIT says why), so the reference
loss is the same (start CE + end CE) / 2 on BertForQuestionAnswering's logits with padding masked as
bertjax masks it; on rows without padding it is transformers' own loss (checked below)."""

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
from bertjax.finetune import train as ft
from bertjax.finetune.squad import model as qa_model
from bertjax.hf import convert, weights as W
from conftest import load_config, micro
from test_finetune_parity import FLOOR, LOSS_RTOL, PARAM_TOL, SPECIAL, STEPS, random_params

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import torch_reference as ref  # noqa: E402  (needs torch; tests/torch_reference.py)


def batches(vocab, b=8, s=32, q=6):
  """Windows [CLS] question [SEP] context [SEP] with padding; a third of the rows labeled at [CLS] (no
  answer in the window), the rest at a span inside the context. Two batches in turn."""
  for t in range(STEPS):
    rng = np.random.default_rng(t % 2)
    lengths = rng.integers(s // 2 + 4, s + 1, b)
    lengths[1] = s  # one row without padding
    ids = rng.integers(5, vocab, (b, s)).astype(np.int32)
    ids[:, 0], ids[:, q + 1] = SPECIAL.cls, SPECIAL.sep
    ids[np.arange(b), lengths - 1] = SPECIAL.sep
    groups = (np.arange(s)[None] < lengths[:, None]).astype(np.int32)
    types = ((np.arange(s)[None] > q + 1) * groups).astype(np.int32)
    start = rng.integers(q + 2, lengths - 3)
    end = start + rng.integers(0, 3, b)
    none = np.arange(b) % 3 == 0
    start, end = np.where(none, 0, start).astype(np.int32), np.where(none, 0, end).astype(np.int32)
    yield dict(input_ids=np.where(groups > 0, ids, SPECIAL.pad), type_ids=types, groups=groups,
               start_position=start, end_position=end, is_impossible=none.astype(np.float32),
               example_weight=np.ones(b, np.float32))


def masked_loss(out, batch):
  """(start CE + end CE) / 2, batch mean, on transformers' logits with padding at qa_model.PADDING_LOGIT."""
  pad = ~torch.tensor(batch["groups"] > 0)
  ce = torch.nn.functional.cross_entropy
  start = out.start_logits.masked_fill(pad, qa_model.PADDING_LOGIT)
  end = out.end_logits.masked_fill(pad, qa_model.PADDING_LOGIT)
  return (ce(start, ref.long(batch["start_position"])) + ce(end, ref.long(batch["end_position"]))) / 2


def test_squad_steps_match_bert_for_question_answering(tmp_path):
  pre = micro("configs/bert.py:tiny")
  pre.model.vocab_size = 300
  pre.model.dropout = pre.model.attention_dropout = 0.0
  pretrained = random_params(pre)
  dirs = convert.write_hf(pre, pretrained, str(tmp_path / "hf"), special=SPECIAL)

  config = load_config("configs/finetune.py:squad2")
  config.learning_rate = 3e-4  # large enough that 20 steps move the loss visibly
  enc = model_config.encoder_config(pre.model)
  model = qa_model.SpanQA(enc, deterministic=False)
  params, fresh = qa_model.init_params(model, jax.random.key(3), pretrained)
  assert fresh == ["qa_outputs"]
  tx = ft.make_tx(config, params, enc, STEPS, 5)
  step = jax.jit(functools.partial(ft.train_step, model=model, tx=tx, task_loss=qa_model.loss))
  initial = jax.tree.map(np.asarray, params)

  hf = transformers.BertForQuestionAnswering.from_pretrained(dirs[0], attn_implementation="eager")
  ref.set_linear(hf.qa_outputs, initial["qa_outputs"])  # the fresh head: ours, in both
  hf = ref.reference_semantics(hf)
  view = ml_collections.ConfigDict(dict(learning_rate=config.learning_rate, warmup_steps=5, total_steps=STEPS,
                                        optimizer=config.optimizer.to_dict()))
  opt, sched, torch_params = ref.adamw(view, [hf])

  state = tx.init(params)
  ours, theirs = [], []
  for t, batch in enumerate(batches(pre.model.vocab_size)):
    assert (batch["start_position"] == 0).any() and (batch["start_position"] > 0).any()
    params, state, loss = step(params, state, batch, jnp.uint32(0), jnp.int32(t))
    ours.append(float(loss))
    out = hf(input_ids=ref.long(batch["input_ids"]), attention_mask=ref.long(batch["groups"]),
             token_type_ids=ref.long(batch["type_ids"]), start_positions=ref.long(batch["start_position"]),
             end_positions=ref.long(batch["end_position"]))
    loss_ref = masked_loss(out, batch)
    full = batch["groups"].all(1)
    if t == 0:  # the masking changes nothing where there is no padding: transformers' own loss there
      with torch.no_grad():
        sub = hf(input_ids=ref.long(batch["input_ids"][full]), token_type_ids=ref.long(batch["type_ids"][full]),
                 start_positions=ref.long(batch["start_position"][full]),
                 end_positions=ref.long(batch["end_position"][full]))
        own = float(masked_loss(sub, {k: v[full] for k, v in batch.items()}))
      assert full.any() and own == pytest.approx(float(sub.loss), rel=1e-6)
    theirs.append(ref.train_step(loss_ref, opt, sched, torch_params, config.optimizer.clip_norm))
  np.testing.assert_allclose(ours, theirs, rtol=LOSS_RTOL)
  assert np.mean(theirs[-5:]) < np.mean(theirs[:5])  # it learned

  final = jax.tree.map(np.asarray, params)
  entries = W.embeddings("bert.") + convert._body("bert", pre, "bert.") + W.entries_of("qa_outputs", "qa_outputs")
  mine = W.export_tensors(entries, final)
  reference = hf.state_dict()
  # qa_outputs.bias shifts all start (end) logits of a row alike, which a softmax ignores: its gradient is
  # zero up to rounding, and Adam turns that rounding into steps of either sign. Nothing to compare there.
  del mine["qa_outputs.bias"]
  for key, value in mine.items():
    expected = reference[key].detach().numpy()
    assert np.abs(value - expected).max() / max(np.abs(expected).max(), FLOOR) <= PARAM_TOL, key
