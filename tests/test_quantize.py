"""int8 (bertjax.compress.quantize, qwix): int8 inference against float, QAT's forward and gradients."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

pytest.importorskip("qwix")

from bertjax.compress import quantize
from bertjax.core import sharding as sh
from bertjax.finetune.classification.model import Classifier
from bertjax.model import config as model_config
from conftest import micro

# int8 logits may differ from float by at most this share of the largest float logit (per-channel weights and
# per-token activations at 8 bits: ~2% on this micro model).
TOLERANCE = 0.05


@pytest.fixture(scope="module")
def model_and_inputs():
  c = micro(**{"model.vocab_size": 50, "model.num_heads": 4})
  model = Classifier(model_config.encoder_config(c.model), 3, deterministic=True)
  rng = np.random.default_rng(0)
  ids = rng.integers(5, 50, (16, 16)).astype(np.int32)
  inputs = (ids, np.zeros_like(ids), (np.arange(16)[None] < rng.integers(4, 17, (16, 1))).astype(np.int32))
  params = sh.strip_boxes(model.init(jax.random.key(0), *inputs)["params"])
  params["classifier"]["kernel"] = params["classifier"]["kernel"] * 30  # logits of order 1 (a float layer)
  return model, params, inputs


def test_int8_logits_match_float_within_tolerance(model_and_inputs):
  model, params, inputs = model_and_inputs
  ref = np.asarray(model.apply({"params": params}, *inputs))
  q = quantize.int8(model)
  qparams = quantize.int8_params(q, params, *inputs)
  kernel = qparams["encoder"]["layers"]["ffn"]["intermediate"]["kernel"].array
  assert kernel.qvalue.dtype == jnp.int8 and kernel.qvalue.shape == (2, 64, 128)  # stored int8, per layer
  assert kernel.scale.shape == (2, 1, 128)  # one scale per layer and output channel
  out = np.asarray(q.apply({"params": qparams}, *inputs))
  err = np.abs(out - ref).max() / np.abs(ref).max()
  assert 0 < err < TOLERANCE, err
  assert (out.argmax(-1) == ref.argmax(-1)).mean() >= 0.9
  hlo = jax.jit(lambda p: q.apply({"params": p}, *inputs)).lower(qparams).as_text()
  int8_dots = [l for l in hlo.splitlines() if "dot_general" in l and "xi8>, tensor<" in l]
  assert len(int8_dots) == 6  # q, k, v, output, FFN in and out of the (scanned) layer run on int8 operands
  # QAT's fake-quantized forward is what the int8 model computes.
  np.testing.assert_allclose(np.asarray(quantize.qat(model).apply({"params": params}, *inputs)), out, atol=1e-5)


def test_qat_passes_gradients_straight_through(model_and_inputs):
  model, params, inputs = model_and_inputs
  qat = quantize.qat(model)
  loss = lambda p, m: (m.apply({"params": p}, *inputs) ** 2).mean()
  g = jax.grad(loss)(params, qat)
  g_float = jax.grad(loss)(params, model)
  a = np.asarray(g["encoder"]["layers"]["attention"]["query"]["kernel"])
  b = np.asarray(g_float["encoder"]["layers"]["attention"]["query"]["kernel"])
  assert np.isfinite(a).all() and np.abs(a).max() > 0
  assert np.corrcoef(a.ravel(), b.ravel())[0, 1] > 0.9  # close to the float gradient, not zero (rounding's)


def test_finetuning_evaluates_the_int8_model(model_and_inputs):
  """finetune's model.quantize=int8 scores the int8 model made from the fine-tuned params."""
  from bertjax.finetune import train
  from conftest import load_config

  model, params, inputs = model_and_inputs
  config = load_config("configs/finetune.py:tiny")
  config.model.quantize, config.eval_batch_size = "int8", 16
  arrays = dict(input_ids=inputs[0], type_ids=inputs[1], groups=inputs[2], label=np.zeros(16, np.int32))
  q = quantize.int8(model)
  expected = jax.jit(q.apply)({"params": quantize.int8_params(q, params, *inputs)}, *inputs)  # jitted, as scored
  np.testing.assert_allclose(train.evaluator(config, model, arrays)(params), expected, atol=1e-6)
  config.model.quantize, config.init.checkpoint, config.task.source = "int4", "ckpt", "tsv:dir"
  with pytest.raises(train.UserError, match="model.quantize='int4'"):
    train.validate(config)
