"""The train step: gradient accumulation equals the large batch, bf16 tracks fp32, NaN steps are skipped."""

import jax
import numpy as np

from bertjax.core import sharding
from bertjax.data.tokenizer import SPM_SPECIAL
from bertjax.train import build
from conftest import micro


def _batch(config, seed=0):
  rng = np.random.default_rng(seed)
  b, s = config.batch_size, config.seq_len
  ids = rng.integers(5, config.model.vocab_size, (b, s)).astype(np.int32)
  ids[:, 0], ids[:, s // 2], ids[:, -1] = 2, 3, 3
  types = np.zeros((b, s), np.int32)
  types[:, s // 2 + 1:] = 1
  lengths = rng.integers(s // 2 + 4, s + 1, b)
  groups = (np.arange(s)[None] < lengths[:, None]).astype(np.int32)
  ids = np.where(groups > 0, ids, 0)
  return dict(input_ids=ids, type_ids=types * groups, word_start=rng.random((b, s)) < 0.7, groups=groups,
              sentence_label=rng.integers(0, 2, b).astype(np.int32), example_weight=np.ones(b, np.float32))


def _run(config, n_steps=3, same_batch=False):
  mesh = sharding.make_mesh("dp", devices=jax.devices()[:1])
  steps = build.make_steps(config, mesh, SPM_SPECIAL)
  state = steps.init(jax.random.key(0))
  losses = []
  for i in range(n_steps):
    state, m = steps.train(state, _batch(config, 0 if same_batch else i))
    losses.append(m["loss"].compute())
  return losses, jax.tree.map(np.asarray, state.params)


def test_gradient_accumulation_equals_the_large_batch_step():
  config = micro(batch_size=16)
  config.model.dropout = config.model.attention_dropout = 0.0
  ref_losses, ref = _run(config)
  config.grad_accum_steps = 4
  losses, params = _run(config)
  np.testing.assert_allclose(losses, ref_losses, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(ref), jax.tree.leaves(params)):
    np.testing.assert_allclose(a, b, atol=2e-6)


def test_bfloat16_compute_tracks_float32_within_2_percent():
  """Params stay fp32; LayerNorm, softmax and losses run in fp32, so bf16 matmuls move the loss little."""
  config = micro(batch_size=16)
  config.model.dropout = config.model.attention_dropout = 0.0
  fp32, p32 = _run(config, 5, same_batch=True)  # one batch: the loss must fall step by step
  config.model.dtype = "bfloat16"
  bf16, p16 = _run(config, 5, same_batch=True)
  np.testing.assert_allclose(bf16, fp32, rtol=0.02)
  assert all(x.dtype == np.float32 for x in jax.tree.leaves(p16))
  assert fp32[-1] < fp32[0] and bf16[-1] < bf16[0]


def test_a_nonfinite_batch_skips_the_update():
  config = micro(batch_size=16)
  mesh = sharding.make_mesh("dp", devices=jax.devices()[:1])
  steps = build.make_steps(config, mesh, SPM_SPECIAL)
  state = steps.init(jax.random.key(0))
  before = jax.tree.map(np.asarray, state.params)
  bad = _batch(config)
  bad["example_weight"] = np.full(config.batch_size, np.nan, np.float32)
  state, m = steps.train(state, bad)
  assert m["skipped"].compute() == 1.0 and int(state.step) == 1
  for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(state.params)):
    np.testing.assert_array_equal(a, np.asarray(b))
  state, m = steps.train(state, _batch(config))
  assert m["skipped"].compute() == 0.0


def test_random_streams_never_share_a_key():
  """Masking, every microbatch's dropout and ELECTRA sampling, and the eval streams: all keys of a few
  steps (and seeds) are distinct, and the step's own derivation uses exactly these keys."""
  from bertjax.train import step as step_lib

  keys = {}
  for seed in (0, 1):
    for t in range(3):
      keys[(seed, t, "masking")] = step_lib.stream_key(seed, t, "masking")
      for i in range(4):
        for name, key in step_lib.model_rngs(seed, t, i).items():
          keys[(seed, t, name, i)] = key
  for index in range(3):
    for name in ("eval/masking", "eval/sample"):
      keys[(index, name)] = step_lib.stream_key(step_lib.EVAL_SEED, index, name)
  words = {tuple(np.asarray(jax.random.key_data(k)).tolist()) for k in keys.values()}
  assert len(words) == len(keys)



def test_parameter_and_update_norms_only_on_logged_steps():
  """param_norm and update_norm are computed on the steps the loop logs (every log_every-th, phase ends),
  and a log window's value is that step's: the norm of the parameters and of the change it made."""
  from bertjax.core.metrics import finalize, sum_metrics

  config = micro(batch_size=16)
  config.log_every = 2
  mesh = sharding.make_mesh("dp", devices=jax.devices()[:1])
  steps = build.make_steps(config, mesh, SPM_SPECIAL)
  assert steps.cfg.report_every == 2 and steps.cfg.report_at == (config.total_steps,)
  state = steps.init(jax.random.key(0))
  state, first = steps.train(state, _batch(config, 0))  # step 1: not logged
  assert float(first["param_norm"].count) == 0 and float(first["update_norm"].total) == 0
  before = jax.tree.map(np.array, state.params)
  state, second = steps.train(state, _batch(config, 1))  # step 2: logged
  after = jax.tree.map(np.asarray, state.params)
  norm = lambda tree: np.sqrt(sum(np.sum(np.square(x, dtype=np.float64)) for x in jax.tree.leaves(tree)))
  window = finalize(jax.device_get(sum_metrics(first, second)))
  np.testing.assert_allclose(window["param_norm"], norm(after), rtol=1e-5)
  np.testing.assert_allclose(window["update_norm"], norm(jax.tree.map(np.subtract, after, before)), rtol=1e-4)
  assert window["update_norm"] > 0
