"""The training loop's per-layer layout (bertjax.model.unstacked): where every layer runs unrolled (the CPU), the state
splits its stacked leaves per layer; it trains as the stacked state does, its compiled step slices and concatenates
no parameter, and checkpoints stay stacked both ways (an old stacked checkpoint resumes in the split layout)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.core import sharding
from bertjax.core.metrics import finalize
from bertjax.data.tokenizer import SPM_SPECIAL
from bertjax.model import unstacked
from bertjax.train import bench, build, checkpoint, optim
from conftest import layer_copies, layer_shapes, micro

STEPS = 3


@pytest.fixture(scope="module")
def runs():
  """LAMB (per-tensor trust ratios, the decay mask) trained STEPS steps from the same init, stacked and split."""
  config = micro(**{"optimizer.name": "lamb", "model.hidden_size": 32, "model.intermediate_size": 64,
                    "seq_len": 16, "batch_size": 4})
  mesh = sharding.make_mesh(config.sharding, overrides=dict(config.mesh))
  batch = jax.device_put(bench.synthetic_batch(config, 4), jax.sharding.NamedSharding(mesh, sharding.batch_spec()))
  out = {}
  for split in (False, True):
    steps = build.make_steps(config, mesh, SPM_SPECIAL, split=split)
    compiled = steps.train.lower(steps.abstract_state, batch).compile()
    state, losses, states = steps.init(jax.random.key(0)), [], []
    for _ in range(STEPS):
      states.append(jax.device_get(state))  # the step donates its input
      state, metrics = compiled(state, batch)
      losses.append(float(finalize(jax.device_get(metrics))["loss"]))
    out[split] = dict(steps=steps, compiled=compiled, state=state, states=states, losses=losses)
  return config, batch, out


def _tree(rng):
  """A parameter tree shaped as the encoder's: two stacked layers (LayerNorm, dense) and an unstacked embedding."""
  x = lambda *shape: jnp.asarray(rng.normal(size=shape), jnp.float32)
  layer = {"ln": {"scale": x(2, 8), "bias": x(2, 8)}, "dense": {"kernel": x(2, 8, 16), "bias": x(2, 16)}}
  return {"embeddings": {"word": x(10, 8)}, "encoder": {"layers": {"attention": layer, "ffn": dict(layer)}}}


def test_split_and_join_are_inverse_and_the_optimizer_sees_one_tensor_a_layer():
  """A split leaf's parts are one layer each: not stacked, LayerNorm and biases still undecayed, and LAMB's and
  StableAdamW's per-tensor updates on the split tree are the stacked tree's, to the last bits of their norms."""
  rng = np.random.default_rng(0)
  params, grads = _tree(rng), _tree(rng)
  split = unstacked.split(params)
  assert unstacked.is_split(split) and not unstacked.is_split(params)
  assert split["encoder"]["layers"]["ffn"]["dense"]["kernel"][1].shape == (8, 16)
  assert split["embeddings"]["word"] is params["embeddings"]["word"]
  _assert_equal(unstacked.join(split), params)
  assert not any(jax.tree.leaves(optim.stacked_mask(split)))
  assert all(jax.tree.leaves(optim.stacked_mask(params)["encoder"]))
  decays = {jax.tree_util.keystr(p): v for p, v in jax.tree_util.tree_leaves_with_path(optim.decay_mask(split))}
  assert not decays["['encoder']['layers']['ffn']['ln']['scale'][1]"]
  assert decays["['encoder']['layers']['ffn']['dense']['kernel'][1]"]

  @jax.jit  # one compile: optax run eagerly dispatches hundreds of small ops
  def updates(params, grads):
    out = []
    for tx in (optim.lamb(1e-2, 0.9, 0.999, 1e-6, 0.01), optim.stable_adamw(1e-2, 0.9, 0.999, 1e-6, 0.01)):
      state_stacked, state_split = tx.init(params), tx.init(unstacked.split(params))
      u_stacked, _ = tx.update(grads, state_stacked, params)
      u_split, _ = tx.update(unstacked.split(grads), state_split, unstacked.split(params))
      out.append((u_stacked, unstacked.join(u_split)))
    return out

  for u_stacked, u_split in updates(params, grads):
    for a, b in zip(jax.tree.leaves(u_stacked), jax.tree.leaves(u_split)):
      np.testing.assert_allclose(b, a, rtol=1e-6, atol=1e-9)


def _assert_equal(a, b):
  assert jax.tree.structure(a) == jax.tree.structure(b)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y)


@pytest.mark.slow  # two compiles of the train step and the eval step
def test_the_split_state_trains_as_the_stacked_one(runs):
  """Same losses (bitwise: the gradients are bitwise the same), same parameters up to the last bits of the
  optimizer's per-tensor norms and global norm, summed per layer instead of per stack."""
  _, _, out = runs
  stacked, split = out[False], out[True]
  assert not unstacked.is_split(stacked["state"].params)
  assert unstacked.is_split(split["state"].params) and unstacked.is_split(split["state"].opt_state)
  assert split["losses"] == stacked["losses"]
  joined = jax.device_get(split["steps"].stored(split["state"]))
  assert jax.tree.structure(joined) == jax.tree.structure(stacked["state"])
  for path, a in jax.tree_util.tree_leaves_with_path(stacked["state"].params):  # no decay on a split LN scale, ...
    b = joined.params
    for k in path:
      b = b[k.key]
    np.testing.assert_allclose(b, a, atol=1e-7, rtol=0, err_msg=jax.tree_util.keystr(path))


@pytest.mark.slow  # two compiles of the train step and the eval step
def test_the_split_step_slices_and_concatenates_no_parameter(runs):
  _, batch, out = runs
  shapes = layer_shapes(out[False]["steps"].abstract_state.params)
  assert layer_copies(out[False]["compiled"].as_text(), shapes) > 20  # the stacked step has them: the count sees them
  assert layer_copies(out[True]["compiled"].as_text(), shapes) == 0


@pytest.mark.slow  # two compiles of the train step and the eval step
def test_checkpoints_stay_stacked_and_restore_into_either_layout(runs, tmp_path):
  config, batch, out = runs
  stacked, split = out[False], out[True]
  # Written from the split state: stacked on disk, restored stacked and split.
  ckpt = checkpoint.Checkpointer(str(tmp_path / "new"), async_save=False)
  ckpt.save(STEPS, split["steps"].stored(split["state"]), {})
  ckpt.wait()
  expected = jax.device_get(split["steps"].stored(split["state"]))
  _assert_equal(jax.device_get(ckpt.restore(stacked["steps"].abstract_state)), expected)
  _assert_equal(jax.device_get(ckpt.restore(split["steps"].stored_state)), expected)
  _assert_equal(jax.device_get(split["steps"].to_step(ckpt.restore(split["steps"].stored_state))),
                jax.device_get(split["state"]))
  # Written as before the split layout existed (the stacked state itself): the split run resumes from it.
  old = checkpoint.Checkpointer(str(tmp_path / "old"), async_save=False)
  at = STEPS - 1
  old.save(at, jax.device_put(stacked["states"][at]), {})
  old.wait()
  resumed = split["steps"].to_step(old.restore(split["steps"].stored_state))
  _assert_equal(jax.device_get(split["steps"].stored(resumed)), stacked["states"][at])
  _, metrics = split["compiled"](resumed, batch)
  assert float(finalize(jax.device_get(metrics))["loss"]) == stacked["losses"][at]


@pytest.mark.slow  # two compiles of the train step and the eval step
def test_eval_on_split_params_equals_eval_on_stacked(runs):
  _, batch, out = runs
  stacked, split = out[False], out[True]
  params = split["steps"].stored(split["state"].params)
  index = np.int32(0)
  _assert_equal(jax.device_get(split["steps"].eval(split["state"].params, batch, index)),
                jax.device_get(stacked["steps"].eval(params, batch, index)))


def test_progressive_transfer_gates_a_split_leaf_by_its_layer():
  """MobileBERT's progressive transfer scales each layer's updates by its multiplier (compress.transfer.by_layer):
  a split leaf's part i by multiplier i, as the stacked leaf's slice i."""
  from bertjax.compress import transfer

  tree = {"student": {"encoder": {"layers": {"w": jnp.arange(6.0).reshape(3, 2)}}, "mlm": {"b": jnp.ones(2)}}}
  m = jnp.array([0.0, 1.0, 2.0])
  gated = lambda t: jax.tree.map(jnp.multiply, t, transfer._multiplier_tree(t, m))
  _assert_equal(unstacked.join(gated(unstacked.split(tree))), gated(tree))
