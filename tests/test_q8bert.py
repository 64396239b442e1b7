"""Q8BERT (bertjax.compress.q8bert) against transcriptions of the reference (IntelLabs/nlp-architect
quantization.py): fake quantization, the EMA range update, straight-through gradients, frozen ranges at
eval, and a fine-tuned model's int8 logits against a numpy forward quantized by hand."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from scipy.special import erf

from bertjax.compress import q8bert
from bertjax.core import sharding as sh
from bertjax.finetune import train
from bertjax.finetune.classification.model import Classifier
from bertjax.model.hparams import EncoderConfig, QUANT_RANGES
from conftest import load_config

CFG = EncoderConfig(vocab_size=30, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32,
                    embedding_size=16, max_positions=16, dropout=0.0, attention_dropout=0.0)
HEAD_START = 1  # the classifier is quantized from step 1 here (the reference's 200, shortened for the test)


def ref_quantize(x, s, bits=8):  # nlp-architect quantize(): input.mul(scale).round().clamp(-thresh, thresh)
  t = 2 ** (bits - 1) - 1
  return np.clip(np.round(np.asarray(x, np.float64) * s), -t, t)


def ref_fake_quant(x, threshold):  # FakeLinearQuantizationWithSTE.forward with get_scale(8, threshold)
  s = 127 / threshold
  return ref_quantize(x, s) / s


def ref_ema(maxima, start_step=0, decay=0.9999):  # QuantizedLinear._update_ema over training steps 0, 1, ...
  ema, out = 0.0, []
  for step, m in enumerate(maxima):
    if step == start_step:
      ema = m
    elif step > start_step:
      ema = ema - (1 - decay) * (ema - m)
    out.append(ema)
  return out


def test_fake_quant_equals_the_reference_and_passes_gradients_straight_through():
  x = jnp.asarray(np.random.default_rng(0).normal(size=(4, 7)) * 3, jnp.float32)
  threshold = 2.0  # below max |x|: clipped values too
  s = q8bert.scale(threshold)
  np.testing.assert_allclose(q8bert.fake_quant(x, s), ref_fake_quant(x, threshold), rtol=1e-6)
  w = jnp.asarray(np.random.default_rng(1).normal(size=(5, 3)), jnp.float32)
  np.testing.assert_allclose(q8bert.fake_quant(w, q8bert.weight_scale(w)),
                             ref_fake_quant(w, np.abs(np.asarray(w)).max()), rtol=1e-6)  # per tensor, max |w|
  c = jnp.arange(28.0).reshape(4, 7)
  g = jax.grad(lambda x: (q8bert.fake_quant(x, s) * c).sum())(x)
  np.testing.assert_array_equal(g, c)  # identity, clipped entries included (STE: grad_output unchanged)


def test_ema_update_equals_the_reference():
  maxima = [3.0, 1.0, 5.0, 2.0]
  for start in (0, 2):
    ema, got = jnp.float32(0), []
    for step, m in enumerate(maxima):
      if step >= start:  # the layer updates from its start step on (QuantizedLayer.forward)
        ema = q8bert.ema_update(ema, jnp.asarray([m, -0.5]), step, start, decay=0.9)
      got.append(float(ema))
    np.testing.assert_allclose(got, ref_ema(maxima, start, decay=0.9), rtol=1e-6)


@pytest.fixture(scope="module")
def finetuned(monkeypatch_module):
  """A micro classifier after 3 Q8BERT training steps through the fine-tuning train_step."""
  monkeypatch_module.setattr(q8bert, "HEAD_START_STEP", HEAD_START)
  rng = np.random.default_rng(0)
  ids = rng.integers(1, 30, (4, 8)).astype(np.int32)
  groups = (np.arange(8)[None] < np.array([[8], [5], [8], [3]])).astype(np.int32)
  batch = dict(input_ids=ids, type_ids=(np.arange(8)[None] >= 4).astype(np.int32) * groups, groups=groups,
               label=np.array([0, 1, 1, 0], np.int32), example_weight=np.ones(4, np.float32))
  inputs = (batch["input_ids"], batch["type_ids"], batch["groups"])
  model = Classifier(CFG, 2, classifier_dropout=0.0, deterministic=True)
  params = sh.strip_boxes(jax.jit(model.init)(jax.random.key(0), *inputs)["params"])
  params["classifier"]["kernel"] = params["classifier"]["kernel"] * 30  # logits of order 1
  q = q8bert.model(model)
  state = q8bert.init_ranges(q, *inputs)
  tx = optax.adamw(1e-2)
  step = jax.jit(functools.partial(train.train_step, model=q, tx=tx))
  opt_state, states = tx.init(params), [state]
  for i in range(3):
    params, opt_state, loss, state = step(params, opt_state, batch, jnp.uint32(0), jnp.int32(i), state)
    assert np.isfinite(loss)
    states.append(state)
  return model, q, params, states, inputs


@pytest.fixture(scope="module")
def monkeypatch_module():
  with pytest.MonkeyPatch.context() as mp:
    yield mp


def test_ranges_are_learned_in_training_and_frozen_at_eval(finetuned):
  model, q, params, states, inputs = finetuned
  r = lambda s, *path: np.asarray(functools.reduce(lambda d, k: d[k], path, s[QUANT_RANGES]))
  assert r(states[3], "encoder", "layers", "attention", "query", "step").tolist() == [3, 3]  # per layer
  assert r(states[1], "classifier", "input_max") == 0 < r(states[2], "classifier", "input_max")  # from step 1
  assert r(states[3], "encoder", "layers", "ffn", "intermediate", "input_max").min() > 0
  # Eval reads the ranges: a row scores the same alone as in its batch (a range measured on the batch, per
  # tensor, would move with the other rows), other ranges give other logits, and a training pass moves them.
  variables, apply = {"params": params, **states[3]}, train._predict_fn(q)  # the compile finetune's eval uses
  batch = dict(zip(("input_ids", "type_ids", "groups"), inputs))
  out = np.asarray(apply(variables, batch))
  np.testing.assert_allclose(np.asarray(apply(variables, {k: v[1:2] for k, v in batch.items()})), out[1:2], atol=1e-6)
  halved = jax.tree.map(lambda v: v / 2 if v.dtype == jnp.float32 else v, states[3])
  assert np.abs(np.asarray(apply({"params": params, **halved}, batch)) - out).max() > 1e-3


def _layer_norm(x, p):
  mu = x.mean(-1, keepdims=True)
  return (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + 1e-12) * p["scale"] + p["bias"]


def _linear(x, p, ranges, n_in=1, quantized=True):
  """QuantizedLinear.inference_quantized_forward: int input and weight, 32-bit bias, dequantized; then
  dequantize(quantize(out)) with the output range where the layer requantizes (else nn.Linear)."""
  k = np.asarray(p["kernel"], np.float64)
  if not quantized:
    return np.tensordot(x, k, n_in) + p["bias"]
  lead, out_shape = x.shape[: x.ndim - n_in], k.shape[n_in:]
  x2, k2 = x.reshape(int(np.prod(lead)), -1), k.reshape(int(np.prod(k.shape[:n_in])), -1)
  s_in, s_w = 127 / float(ranges["input_max"]), 127 / np.abs(k).max()
  acc = ref_quantize(x2, s_in) @ ref_quantize(k2, s_w) + ref_quantize(p["bias"].reshape(-1), s_in * s_w, 32)
  y = (acc / (s_in * s_w)).reshape(*lead, *out_shape)
  return ref_fake_quant(y, float(ranges["output_max"])) if "output_max" in ranges else y


def _hand_forward(params, ranges, ids, types, groups, quantized=True):
  """QuantizedBertForSequenceClassification's eval forward in numpy (float64) from the same weights (with
  quantized=False, BertForSequenceClassification's)."""
  p = jax.tree.map(lambda a: np.asarray(a, np.float64), params)
  rg = jax.tree.map(np.asarray, ranges)
  e = p["embeddings"]
  fq = (lambda t: ref_fake_quant(t, np.abs(t).max())) if quantized else (lambda t: t)
  word, pos = fq(e["word"]), fq(e["position"])  # QuantizedEmbedding, per tensor
  x = _layer_norm(word[ids] + pos[None, : ids.shape[1]] + e["type"][types], e["ln"])  # token type: mode none
  bias = np.where((groups[:, None, :] == groups[:, :, None]) & (groups[:, None, :] > 0), 0.0, -1e9)[:, None]
  _lin = functools.partial(_linear, quantized=quantized)
  for i in range(CFG.num_layers):
    lp = jax.tree.map(lambda a: a[i], p["encoder"]["layers"])
    lr = jax.tree.map(lambda a: a[i], rg["encoder"]["layers"])
    a, ar = lp["attention"], lr["attention"]
    qh, kh, vh = (_lin(x, a[n], ar[n]) for n in ("query", "key", "value"))
    scores = np.einsum("bqhd,bkhd->bhqk", qh, kh) / np.sqrt(CFG.head_dim) + bias
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    ctx = np.einsum("bhqk,bkhd->bqhd", probs, vh)
    x = _layer_norm(x + _lin(ctx, a["output"], ar["output"], n_in=2), a["ln"])
    f, fr = lp["ffn"], lr["ffn"]
    h = _lin(x, f["intermediate"], fr["intermediate"])
    h = h * (1 + erf(h / np.sqrt(2))) / 2
    x = _layer_norm(x + _lin(h, f["output"], fr["output"]), f["ln"])
  pooled = np.tanh(_lin(x[:, 0], p["pooler"], rg["pooler"]))
  return _lin(pooled, p["classifier"], rg["classifier"])


def test_int8_logits_equal_a_hand_quantized_forward(finetuned, tmp_path):
  model, q, params, states, inputs = finetuned
  state = states[3]
  config = load_config("configs/finetune.py:tiny")
  config.model.quantize, config.eval_batch_size = "q8bert", 4
  arrays = dict(zip(("input_ids", "type_ids", "groups"), inputs), label=np.zeros(4, np.int32))
  q8bert.save_ranges(str(tmp_path), state)  # the ranges travel with a saved model
  out = train.evaluator(config, model, arrays)(params, q8bert.load_ranges(str(tmp_path)))  # as finetune scores
  hand = _hand_forward(params, state[QUANT_RANGES], *inputs)
  np.testing.assert_allclose(out, hand, atol=1e-4)
  flt = _hand_forward(params, state[QUANT_RANGES], *inputs, quantized=False)
  assert np.abs(out - flt).max() > 1e-3  # quantization shows
