"""Length-bucketed fine-tuning batches (bertjax.finetune.batches): the same loss and gradients at a bucket's
length as at seq_len, at most one compile per bucket, batches a pure function of (seed, step)."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bertjax.core.errors import UserError
from bertjax.core import sharding as sh
from bertjax.finetune import batches, tasks, train
from bertjax.finetune.classification import model as cls_model, task as classification
from bertjax.model import config as model_config
from conftest import load_config, micro

SEQ = 32


def _config(**overrides):
  c = load_config("configs/finetune.py:tiny")
  c.seq_len, c.batch_size, c.bucket_lengths, c.length_window = SEQ, 8, "8,16,24", 4
  c.update(overrides)
  return c


def _arrays(n=40, seed=0, short=False):
  """Rows of lengths 3..SEQ (or 3..12 with `short`), padded to SEQ as task data are."""
  rng = np.random.default_rng(seed)
  lengths = rng.integers(3, 13 if short else SEQ + 1, n)
  groups = (np.arange(SEQ)[None] < lengths[:, None]).astype(np.int32)
  return dict(input_ids=rng.integers(5, 50, (n, SEQ)).astype(np.int32) * groups,
              type_ids=(np.arange(SEQ)[None] >= lengths[:, None] // 2).astype(np.int32) * groups,
              groups=groups, label=rng.integers(0, 2, n).astype(np.int32))


@functools.lru_cache(maxsize=1)
def _classifier():
  cfg = model_config.encoder_config(micro("configs/bert.py:tiny", **{"model.vocab_size": 50}).model)
  model = cls_model.Classifier(cfg, 2, deterministic=True)
  ids = jnp.zeros((1, 8), jnp.int32)
  return model, sh.strip_boxes(model.init(jax.random.key(0), ids, ids, jnp.ones_like(ids))["params"])


def test_bucket_lengths_default_to_multiples_of_32_and_end_at_seq_len():
  c = ml_collections.ConfigDict(dict(seq_len=128, bucket_lengths="auto"))
  assert batches.bucket_lengths(c) == (32, 64, 96, 128)
  c.seq_len = 100
  assert batches.bucket_lengths(c) == (32, 64, 96, 100)
  c.bucket_lengths = "none"
  assert batches.bucket_lengths(c) == (100,)
  c.bucket_lengths = "64,16"
  assert batches.bucket_lengths(c) == (16, 64, 100)
  for bad in ("16,200", "short"):
    c.bucket_lengths = bad
    with pytest.raises(UserError, match="bucket_lengths"):
      batches.bucket_lengths(c)


def test_auto_buckets_are_fitted_to_the_training_lengths():
  """"auto" with the training rows' lengths: seq_len / 32 buckets, multiples of 8, placed where they compute
  the fewest positions (checked against every choice), seq_len kept last; an eval split shares them."""
  import itertools

  rng = np.random.default_rng(0)
  lengths = np.clip(rng.lognormal(2.4, 0.6, 2000).astype(int) + 2, 3, 66)  # SST-2-like: mean ~14, max 66
  c = ml_collections.ConfigDict(dict(seq_len=128, bucket_lengths="auto"))
  fitted = batches.bucket_lengths(c, lengths)
  assert len(fitted) <= 5 and fitted[-1] == 128 and all(b % 8 == 0 for b in fitted)
  cost = lambda bs: sum(next(b for b in bs if b >= n) for n in lengths)
  widths = sorted({-(-int(n) // 8) * 8 for n in lengths})
  best = min(cost(bs) for r in range(1, 5) for bs in itertools.combinations(widths, r) if bs[-1] == widths[-1])
  assert cost(fitted) == best
  assert cost(fitted) < 0.7 * cost((32, 64, 96, 128))  # what multiples of 32 compute
  assert batches.fitted_buckets([5, 5, 5], 128, 4) == (8,)  # no more buckets than lengths to hold
  arrays = {"groups": (np.arange(128)[None] < np.array([[100], [3]])).astype(np.int32)}
  eval_layout = batches.layout(c, arrays, ("groups",), buckets=fitted)
  assert eval_layout.buckets == fitted and list(eval_layout.lengths) == [100, 3]


@pytest.mark.parametrize("epoch_mode,window", [("transformers", 5), ("bert", 5), ("bert", 0)])
def test_auto_buckets_fit_the_longest_row_of_every_training_batch(epoch_mode, window):
  """batch_longest gives each batch's longest row as batch_rows makes the batches (every seed, every step, a
  partial last window included), and buckets fitted to them compute no more positions than buckets fitted to
  the rows' own lengths: a batch costs its bucket x batch_size, whatever its other rows."""
  rng = np.random.default_rng(1)
  lengths = np.clip(rng.lognormal(3.9, 0.5, 203).astype(int), 8, 128)  # RTE-like: mean ~55
  c = ml_collections.ConfigDict(dict(seq_len=128, bucket_lengths="auto", batch_size=8, length_window=window,
                                     epoch_mode=epoch_mode))
  total, seeds = 57, (3, 4)
  runs = [[batches.batch_rows(len(lengths), step, c, seed, lengths if window else None) for step in range(total)]
          for seed in seeds]
  want = [lengths[r[r >= 0]].max() for run in runs for r in run]
  longest = batches.batch_longest(lengths, total, c, seeds)
  assert sorted(longest) == sorted(want) and len(longest) == total * len(seeds)
  positions = lambda buckets: sum(next(b for b in buckets if b >= m) for m in want)
  by_batches = batches.layout(c, {"groups": np.zeros((1, 128), np.int32)}, (), fit_to=longest).buckets
  assert positions(by_batches) <= positions(batches.bucket_lengths(c, lengths))


@pytest.mark.parametrize("dropout", [False, True])
def test_a_batch_has_the_same_loss_and_gradients_at_its_bucket_and_at_seq_len(dropout):
  """Padding is masked, and dropout masks are drawn at seq_len (EncoderConfig.dropout_length): with dropout
  on, the bucketed batch is the fixed-length batch, not a batch with other random draws."""
  model, params = _classifier()
  rng = None
  if dropout:
    cfg = dataclasses.replace(model.cfg, dropout_length=SEQ, dropout=0.3, attention_dropout=0.3)
    model, rng = cls_model.Classifier(cfg, 2, classifier_dropout=0.3, deterministic=False), jax.random.key(3)
  arrays = _arrays(short=True)
  config = _config()
  layout = batches.layout(config, arrays, tasks.TOKEN_FIELDS)
  rows = np.arange(8)
  cut, full = batches.take(arrays, rows, layout), batches.take(arrays, rows, batches.fixed_layout(arrays))
  assert cut["input_ids"].shape == (8, 16) and full["input_ids"].shape == (8, SEQ)  # rows of <= 12 tokens: bucket 16
  grad = jax.jit(jax.value_and_grad(functools.partial(train.batch_loss, rng=rng, model=model,
                                                      task_loss=classification.loss)))
  (loss_cut, g_cut), (loss_full, g_full) = [grad(params, b) for b in (cut, full)]
  np.testing.assert_allclose(loss_cut, loss_full, rtol=0, atol=1e-6)
  assert float(loss_cut) > 0.1  # a real loss, not an empty batch
  for a, b in zip(jax.tree.leaves(g_cut), jax.tree.leaves(g_full)):
    np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
  if dropout:  # and the draws are real: another key gives another loss
    other = jax.jit(functools.partial(train.batch_loss, rng=jax.random.key(4), model=model,
                                      task_loss=classification.loss))(params, cut)
    assert abs(float(other) - float(loss_cut)) > 1e-4


def test_training_and_evaluation_compile_at_most_once_per_bucket():
  model, params = _classifier()
  config = _config(epoch_mode="transformers", bucket_lengths="16")  # buckets 16 and 32: two shapes
  arrays = _arrays()
  layout = batches.layout(config, arrays, tasks.TOKEN_FIELDS)
  tx = train.make_tx(config, params, model.cfg, 10, 1)
  step = jax.jit(functools.partial(train.train_step, model=model, tx=tx))
  state, widths = tx.init(params), set()
  p = params
  for s in range(10):  # two epochs of 5 batches
    batch = train.train_batch(arrays, s, config, 0, layout)
    widths.add(batch["input_ids"].shape[1])
    p, state, _ = step(p, state, batch, jnp.uint32(0), jnp.int32(s))
  assert widths == {16, SEQ}
  assert step._cache_size() == len(layout.buckets) == 2
  # Evaluation: rows sorted by length, each batch cut to its bucket, outputs back in the split's order.
  train._predict_fn.cache_clear()
  out = train.predict(params, arrays, model, 16, layout)
  assert train._predict_fn(model)._cache_size() <= len(layout.buckets)
  np.testing.assert_allclose(out, train.predict(params, arrays, model, 16), atol=1e-5)


@pytest.mark.parametrize("mode", ["bert", "transformers"])
def test_grouped_batches_are_pure_cover_each_epoch_and_hold_similar_lengths(mode):
  config = _config(epoch_mode=mode, length_window=5)
  arrays = _arrays(n=40)
  lengths = batches.row_lengths(arrays)
  np.testing.assert_array_equal(lengths, arrays["groups"].sum(1))
  rows = [batches.batch_rows(40, s, config, 3, lengths) for s in range(10)]
  assert all(np.array_equal(r, batches.batch_rows(40, s, config, 3, lengths)) for s, r in enumerate(rows))
  for epoch in (rows[:5], rows[5:]):  # 5 batches of 8 = one epoch of 40 rows, one window
    assert sorted(np.concatenate(epoch).tolist()) == list(range(40))
  assert not np.array_equal(np.concatenate(rows[:5]), np.concatenate(rows[5:]))  # reshuffled
  spread = np.mean([np.ptp(lengths[r]) for r in rows])
  plain = np.mean([np.ptp(lengths[batches.batch_rows(40, s, config, 3)]) for s in range(10)])
  assert spread < plain / 2  # grouped by length
  firsts = [int(lengths[r].max()) for r in rows[:5]]
  assert firsts != sorted(firsts, reverse=True)  # the window's batches run in a shuffled order, not longest first
  other = [batches.batch_rows(40, s, config, 4, lengths) for s in range(5)]
  assert not all(np.array_equal(a, b) for a, b in zip(rows, other))  # another seed, other batches
