"""bertjax.inspect: the recomputed attention maps are the ones the encoder's forward pass computes."""

import jax
import numpy as np
import pytest

from bertjax import inspect, loop, sharding
from conftest import micro


@pytest.mark.parametrize("spec", ["configs/bert.py:tiny", "configs/albert.py:tiny"])
def test_attention_probs_match_the_forward_pass(spec, monkeypatch):
  config = micro(spec)
  config.model.num_layers = 3
  model = loop.make_model(config)
  rngs = {"params": jax.random.key(0), "dropout": jax.random.key(1), "sample": jax.random.key(2)}
  params = sharding.strip_boxes(model.init(rngs, loop.dummy_batch(config))["params"])
  ids = np.random.default_rng(0).integers(5, config.model.vocab_size, (2, 12)).astype(np.int32)
  types = np.repeat([[0] * 6 + [1] * 6], 2, axis=0).astype(np.int32)
  got = [inspect.attention_probs(params, config, ids, types, layer=i) for i in range(3)]

  # Record every softmax of the real (scanned) forward pass: one per layer, in layer order.
  recorded, softmax = [], jax.nn.softmax

  def recording_softmax(x, axis=-1, **kwargs):
    y = softmax(x, axis=axis, **kwargs)
    jax.debug.callback(lambda v: recorded.append(np.asarray(v)), y)
    return y

  monkeypatch.setattr(jax.nn, "softmax", recording_softmax)
  model.apply({"params": params}, ids, types, np.ones_like(ids), method="encode")
  assert len(recorded) == 3
  for layer in range(3):
    assert got[layer].shape == (2, config.model.num_heads, 12, 12)
    np.testing.assert_allclose(got[layer], recorded[layer], atol=1e-5, err_msg=f"layer {layer}")
  np.testing.assert_allclose(got[1].sum(-1), 1.0, rtol=1e-5)
  assert not np.allclose(got[0], got[1]), "layers should attend differently"
