"""bertjax.hf.inference: attention maps are the ones the encoder's forward pass computes."""

import jax
import numpy as np
import pytest

from bertjax.core import sharding
from bertjax.hf import inference
from bertjax.train import build
from conftest import micro, tiny_hf_checkpoint


@pytest.mark.parametrize("spec", ["configs/bert.py:tiny", "configs/albert.py:tiny"])  # own and shared blocks
def test_attention_probs_are_the_forward_pass_softmax(spec, monkeypatch):
  config = micro(spec)
  config.model.num_layers = 3
  model = build.make_model(config)
  rngs = {"params": jax.random.key(0), "dropout": jax.random.key(1), "sample": jax.random.key(2)}
  params = sharding.strip_boxes(model.init(rngs, build.dummy_batch(config))["params"])
  ids = np.random.default_rng(0).integers(5, config.model.vocab_size, (2, 12)).astype(np.int32)
  types = np.repeat([[0] * 6 + [1] * 6], 2, axis=0).astype(np.int32)
  got = inference.attention_probs(config, params, ids, types)

  # Record every softmax of a plain forward pass: one per layer, in layer order.
  recorded, softmax = [], jax.nn.softmax

  def recording_softmax(x, axis=-1, **kwargs):
    y = softmax(x, axis=axis, **kwargs)
    jax.debug.callback(lambda v: recorded.append(np.asarray(v)), y)
    return y

  monkeypatch.setattr(jax.nn, "softmax", recording_softmax)
  model.apply({"params": params}, ids, types, np.ones_like(ids), method="encode")
  assert len(recorded) == 3
  assert got.shape == (3, 2, config.model.num_heads, 12, 12)
  for layer in range(3):
    np.testing.assert_allclose(got[layer], recorded[layer], atol=1e-5, err_msg=f"layer {layer}")
  np.testing.assert_allclose(got.sum(-1), 1.0, rtol=1e-5)
  assert not np.allclose(got[0], got[1]), "layers should attend differently"


def test_loaded_params_live_on_the_device_and_give_the_numpy_params_outputs(tmp_path):
  """A loaded model's params are jax arrays: numpy params would be copied to the device on every call."""
  loaded = inference.load(hf_dir=tiny_hf_checkpoint(tmp_path, ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]))
  assert all(isinstance(x, jax.Array) for x in jax.tree.leaves(loaded.params))
  ids = np.array([[2, 5, 6, 3, 0], [2, 6, 3, 0, 0]], np.int32)
  groups = (np.arange(5) < np.array([[4], [3]])).astype(np.int32)
  on_host = jax.tree.map(np.asarray, loaded.params)
  np.testing.assert_array_equal(inference.hidden_states(loaded.config, loaded.params, ids, 0 * ids, groups),
                                inference.hidden_states(loaded.config, on_host, ids, 0 * ids, groups))


def test_run_params_are_split_per_layer_and_the_jitted_calls_copy_no_layer_weight(tmp_path):
  """On the CPU (every layer unrolled) a Loaded's run_params hold each stacked leaf as its layers' arrays: the
  encode call and the fine-tuning predictor's call give the stacked params' outputs to the bit, and their compiled
  forwards slice or concatenate no layer parameter, where the stacked params' forwards slice every one."""
  from bertjax.finetune import train
  from bertjax.finetune.classification.model import Classifier
  from bertjax.model import config as model_config, unstacked
  from bertjax.model.layer import is_stacked
  from conftest import layer_copies, layer_shapes

  loaded = inference.load(hf_dir=tiny_hf_checkpoint(tmp_path, ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "a", "b"]))
  assert unstacked.is_split(loaded.run_params) and not unstacked.is_split(loaded.params)
  ids = np.array([[2, 5, 6, 3, 0], [2, 6, 3, 0, 0]], np.int32)
  groups = (np.arange(5) < np.array([[4], [3]])).astype(np.int32)
  np.testing.assert_array_equal(inference.hidden_states(loaded.config, loaded.params, ids, 0 * ids, groups),
                                inference.hidden_states(loaded.config, loaded.run_params, ids, 0 * ids, groups))
  shapes = layer_shapes(loaded.params)
  stacked = sum(is_stacked(p) for p, _ in jax.tree_util.tree_leaves_with_path(loaded.params))
  copies = lambda fn, *args: layer_copies(fn.lower(*args).compile().as_text(), shapes)

  model = build.make_model(loaded.config)
  jitted = inference._jitted(model, inference._encode_fn, ())
  assert copies(jitted, loaded.params, ids, 0 * ids, groups) >= stacked  # the count sees them
  assert copies(jitted, loaded.run_params, ids, 0 * ids, groups) == 0

  classifier = Classifier(model_config.encoder_config(loaded.config.model), 2, 0.1, deterministic=True)
  params = classifier.init(jax.random.key(0), ids, 0 * ids, groups)["params"]
  params.update(encoder=loaded.params["encoder"], embeddings=loaded.params["embeddings"])
  arrays = dict(input_ids=ids, type_ids=0 * ids, groups=groups)
  split = unstacked.for_calls({"params": params}, classifier.cfg)
  assert unstacked.is_split(split)
  assert copies(train._predict_fn(classifier), {"params": params}, arrays) >= stacked
  assert copies(train._predict_fn(classifier), split, arrays) == 0
  np.testing.assert_array_equal(train.predict(params, arrays, classifier, 2),  # split inside
                                np.asarray(train._predict_fn(classifier)({"params": params}, arrays)))
