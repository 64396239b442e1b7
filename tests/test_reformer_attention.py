"""Reformer's attention kinds against transformers' (models/reformer/modeling_reformer.py): `local`
(bertjax.model.chunked, LocalSelfAttention) and `lsh` (bertjax.model.lsh, LSHSelfAttention) on the same weights and
a padded batch, in eval mode with a fixed hash_seed, outputs within 1e-5 and buckets equal; packed examples never
read each other; the per-layer pattern of kinds (bertjax.model.per_layer); fused implementations refused."""

from unittest import mock

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import linen as nn
from transformers import ReformerConfig
from transformers.models.reformer import modeling_reformer as hf_reformer

from bertjax.core import sharding
from bertjax.core.errors import UserError
from bertjax.data.tokenizer import SPM_SPECIAL
from bertjax.model import chunked, kinds, layer, lsh, per_layer
from bertjax.model.encoder import Encoder
from bertjax.model.hparams import EncoderConfig
from bertjax.train import build
from conftest import micro

H, HEADS, HEAD_DIM, CHUNK = 16, 2, 8, 8


def _configs(kind, **kw):
  """(transformers' ReformerConfig, bertjax's EncoderConfig) of one tiny attention layer; `kw` in transformers'
  names (is_decoder for causal)."""
  hf = ReformerConfig(hidden_size=H, num_attention_heads=HEADS, attention_head_size=HEAD_DIM, attn_layers=[kind],
                      local_attn_chunk_length=CHUNK, lsh_attn_chunk_length=CHUNK, hidden_dropout_prob=0.0,
                      local_attention_probs_dropout_prob=0.0, lsh_attention_probs_dropout_prob=0.0, **kw)
  ours = dict(local_attn_chunk_length=CHUNK, lsh_attn_chunk_length=CHUNK, causal=kw.get("is_decoder", False))
  for key in ("local_num_chunks_before", "local_num_chunks_after", "lsh_num_chunks_before", "lsh_num_chunks_after",
              "num_hashes", "hash_seed"):
    if key in kw:
      ours[key] = kw[key]
  if kw.get("num_buckets"):
    ours["num_buckets"] = tuple(np.atleast_1d(kw["num_buckets"]).tolist())
  c = EncoderConfig(vocab_size=10, hidden_size=H, num_layers=1, num_heads=HEADS, intermediate_size=16,
                    embedding_size=H, head_size=HEAD_DIM, attention_kind=kind, norm="pre", dropout=0.0,
                    attention_dropout=0.0, **ours)
  return hf, c


def _kernel(linear, shape):
  """A torch Linear's weight [out, in] as a bertjax kernel [in, ...] of `shape`."""
  return jnp.asarray(linear.weight.detach().numpy().T.reshape(shape))


def _params(attention):
  """bertjax's parameters of a transformers ReformerAttention's self-attention and output projection."""
  names = {"query_key": "query_key", "query": "query", "key": "key", "value": "value"}
  sa = attention.self_attention
  params = {ours: {"kernel": _kernel(getattr(sa, theirs), (H, HEADS, HEAD_DIM))}
            for ours, theirs in names.items() if hasattr(sa, theirs)}
  params["output"] = {"kernel": _kernel(attention.output.dense, (HEADS, HEAD_DIM, H))}
  return params


def _batch(seq_len):
  """Two rows, the second ending in 5 padding tokens: (hidden states, transformers' mask)."""
  torch.manual_seed(1)
  mask = torch.ones(2, seq_len, dtype=torch.long)
  mask[1, seq_len - 5:] = 0
  return torch.randn(2, seq_len, H), mask


def _compare(kind, block, seq_len, **kw):
  """transformers' self-attention and output projection vs the bertjax block (jitted) on the same weights; LSH's
  rotations are bertjax's hash_seed ones, handed to transformers in place of its torch.randn draw. Returns
  (transformers' buckets without their rounds' offsets, bertjax's sown buckets), or None for a row of one chunk."""
  hf, c = _configs(kind, **kw)
  torch.manual_seed(0)
  attention = hf_reformer.ReformerAttention(hf, 0).eval()
  x, mask = _batch(seq_len)
  r = torch.from_numpy(np.array(lsh.seeded_rotations(c, seq_len))) if kind == "lsh" else None
  with mock.patch.object(hf_reformer.torch, "randn", lambda *a, **k: r.clone()), torch.no_grad():
    out = attention.self_attention(x, attention_mask=mask)
    want = attention.output(out.hidden_states).numpy()
  run = jax.jit(lambda p, x, g: block(c).apply({"params": p}, x, g, mutable="intermediates"))
  got, sown = run(_params(attention), jnp.asarray(x.numpy()), jnp.asarray(mask.numpy()))
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=0)
  if getattr(out, "buckets", None) is None:
    return None
  stride = int(np.prod(np.atleast_1d(hf.num_buckets))) + 1  # transformers' rounds' offsets (with a padding bucket)
  return out.buckets.numpy() % stride, np.asarray(sown["intermediates"]["buckets"][0])


@pytest.mark.parametrize("seq_len,kw", [
    (32, dict(local_num_chunks_before=1, local_num_chunks_after=1)),  # MLM's symmetric neighbours, circular
    (32, dict(local_num_chunks_before=2, local_num_chunks_after=0, is_decoder=True)),  # causal
    (6, dict()),  # a row shorter than a chunk: plain attention
])
def test_local_attention_is_transformers(seq_len, kw):
  _compare("local", chunked.LocalAttention, seq_len, **kw)


@pytest.mark.parametrize("seq_len,kw", [
    # Two rounds, 4 buckets, symmetric neighbours (MLM).
    (32, dict(num_hashes=2, num_buckets=4, lsh_num_chunks_before=1, lsh_num_chunks_after=1)),
    (32, dict(num_hashes=1, num_buckets=[2, 4], is_decoder=True)),  # factorized buckets, causal
    # num_buckets=None: transformers' rule from the length (8 here); three rounds, the next chunk only.
    (32, dict(num_hashes=3, num_buckets=None, lsh_num_chunks_before=0, lsh_num_chunks_after=1)),
    (6, dict(num_hashes=2, num_buckets=4)),  # a row shorter than a chunk: plain attention with the self-mask
])
def test_lsh_attention_and_its_buckets_are_transformers(seq_len, kw):
  buckets = _compare("lsh", lsh.LSHAttention, seq_len, hash_seed=3, **kw)
  if seq_len > CHUNK:
    theirs, ours = buckets
    np.testing.assert_array_equal(ours, theirs)
    assert ours[1, :, :, -5:].min() == ours.max() == theirs.max()  # padding in the extra bucket
  else:
    assert buckets is None


def test_the_bucket_sort_is_stable_and_exact_where_a_scaled_key_overflows_int32():
  # transformers' key (rounds x S) x bucket + index reaches 2 x 2^16 x 2^15 = 2^32 here.
  rounds, s, n_buckets = 2, 2**16, 2**15
  buckets = np.random.default_rng(0).integers(0, n_buckets + 1, (1, 1, rounds, s)).astype(np.int32)
  order, undo = jax.jit(lsh.sort_by_bucket, static_argnums=1)(jnp.asarray(buckets), n_buckets)
  flat = buckets.reshape(-1)
  want = np.lexsort((np.arange(rounds * s), flat, np.repeat(np.arange(rounds), s)))
  np.testing.assert_array_equal(np.asarray(order)[0, 0], want)
  np.testing.assert_array_equal(np.asarray(order)[0, 0][np.asarray(undo)[0, 0]], np.arange(rounds * s))


def test_lsh_keeps_packed_examples_apart():
  # Queries and keys fixed (so are the buckets and chunks); the second example's values changed: the first
  # example's outputs stay, to the bit.
  _, c = _configs("lsh", num_hashes=2, num_buckets=4, lsh_num_chunks_before=1, lsh_num_chunks_after=1)
  qk, v = jax.random.normal(jax.random.key(0), (2, 1, 2, 32, HEAD_DIM))
  groups = jnp.asarray([[1] * 12 + [2] * 14 + [0] * 6])
  run = jax.jit(lambda v: lsh.lsh_attention(qk, v, groups, lsh.seeded_rotations(c, 32), (4,), CHUNK, 1, 1, False,
                                            lambda p: p)[0])
  first = np.asarray(run(v))[0, :, :12]
  np.testing.assert_array_equal(np.asarray(run(v.at[:, :, 12:26].multiply(-3.0)))[0, :, :12], first)
  assert np.abs(np.asarray(run(v.at[:, :, :12].multiply(-3.0)))[0, :, :12] - first).max() > 1e-3
  # Buckets passed in (a reversible recompute's) are used instead of hashing.
  given = jax.jit(lambda b: lsh.lsh_attention(qk, v, groups, None, (4,), CHUNK, 1, 1, False, lambda p: p, b))
  out, buckets = given(lsh.hash_buckets(qk, lsh.seeded_rotations(c, 32), groups, (4,)))
  np.testing.assert_array_equal(np.asarray(out)[0, :, :12], first)
  assert np.abs(np.asarray(given((buckets + 1) % 4)[0])[0, :, :12] - first).max() > 1e-3


def test_rotations_are_drawn_per_layer_and_step_or_fixed_by_hash_seed():
  _, c = _configs("lsh", num_hashes=1, num_buckets=8)  # hash_seed -1: transformers' None
  x, groups = jax.random.normal(jax.random.key(0), (1, 32, H)), jnp.ones((1, 32), jnp.int32)
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda s: jnp.asarray(rng.normal(0, 0.3, s.shape), jnp.float32),
                        nn.unbox(jax.eval_shape(lsh.LSHAttention(c).init, jax.random.key(1), x, groups)))

  def buckets(c, deterministic=True):
    def run(layer_index, key):
      _, sown = lsh.LSHAttention(c, deterministic).apply(params, x, groups, layer_index=layer_index,
                                                         rngs={"dropout": key}, mutable="intermediates")
      return sown["intermediates"]["buckets"][0]
    run = jax.jit(run)
    return lambda i, seed=0: np.asarray(run(i, jax.random.key(seed)))

  evaluate, train = buckets(c), buckets(c, deterministic=False)
  np.testing.assert_array_equal(evaluate(0), evaluate(0))  # evaluation: the layer's own rotations, every time
  assert not np.array_equal(evaluate(0), evaluate(1))
  assert not np.array_equal(train(0, seed=1), train(0, seed=2))  # training: new rotations from each step's key
  seeded = buckets(dataclasses.replace(c, hash_seed=5), deterministic=False)
  np.testing.assert_array_equal(seeded(0, seed=1), seeded(1, seed=2))  # hash_seed: one R for every layer and step


def test_local_attention_wraps_around_and_keeps_packed_examples_apart():
  _, c = _configs("local", local_num_chunks_before=1, local_num_chunks_after=0)
  block = chunked.LocalAttention(c)
  x = jax.random.normal(jax.random.key(0), (1, 32, H))
  params = jax.jit(block.init)(jax.random.key(1), x, jnp.ones((1, 32), jnp.int32))
  run = jax.jit(block.apply)
  base = run(params, x, jnp.ones((1, 32), jnp.int32))
  # Circular: chunk 0 reads the last chunk (transformers' _look_adjacent), so changing it changes position 0.
  moved = run(params, x.at[:, -CHUNK:].add(1.0), jnp.ones((1, 32), jnp.int32))
  assert np.abs(np.asarray(moved - base)[0, 0]).max() > 1e-3
  # Two packed examples (and padding): changing the second example leaves the first as it was.
  groups = jnp.asarray([[1] * 12 + [2] * 14 + [0] * 6])
  packed = run(params, x, groups)
  other = run(params, x.at[:, 12:26].multiply(-2.0), groups)
  np.testing.assert_array_equal(np.asarray(other)[0, :12], np.asarray(packed)[0, :12])
  assert np.abs(np.asarray(packed - base)[0, :12]).max() > 1e-3  # without groups it reads the other example


def test_fused_attention_is_refused_in_one_line():
  config = micro(**{"model.attention_kind": "local", "model.attention": "cudnn"})
  with pytest.raises(UserError, match="model.attention_kind=local has no fused kernel.*model.attention=xla"):
    build.validate(config)
  config = micro(**{"model.attention_kind": "per_layer", "model.attn_layers": "local,lsh", "model.attention": "splash"})
  with pytest.raises(UserError, match="model.attention_kind=local has no fused kernel"):
    build.validate(config)
  config = micro(**{"model.causal": True})
  with pytest.raises(UserError, match="model.causal=True masks later keys in the local and lsh"):
    build.validate(config)


def _pattern_config(num_layers, **kw):
  """A tiny pre-norm encoder of local and lsh layers in turn."""
  return EncoderConfig(vocab_size=10, hidden_size=H, num_layers=num_layers, num_heads=HEADS, intermediate_size=32,
                       embedding_size=H, head_size=HEAD_DIM, attention_kind="per_layer", attn_layers=("local", "lsh"),
                       norm="pre", dropout=0.0, attention_dropout=0.0, local_attn_chunk_length=CHUNK,
                       lsh_attn_chunk_length=CHUNK, num_buckets=(4,), num_hashes=2, **kw)


def _one_by_one(c, params, x, groups):
  """The encoder's layers as separate Layer modules of their own kinds, layer i from step i // P, slot i % P."""
  carry, p = (x, x), per_layer.period(c)
  for i in range(c.num_layers):
    slot = jax.tree.map(lambda a: a[i // p], params[str(i % p)])
    one = layer.Layer(dataclasses.replace(c, attention_kind=c.attn_layers[i % p]))
    (carry, _), _ = one.apply({"params": slot}, (carry, None), i, groups, {}, None, None)
  return carry[1]


@pytest.mark.parametrize("num_layers", [2, pytest.param(4, marks=pytest.mark.slow)])  # 4: two rolled scan steps
def test_a_per_layer_pattern_scans_its_period_and_equals_its_layers_run_one_by_one(num_layers):
  c = _pattern_config(num_layers, hash_seed=1, scan_unroll=1)
  x = jax.random.normal(jax.random.key(0), (2, 32, H))
  groups = jnp.ones((2, 32), jnp.int32).at[1, -5:].set(0)
  # Random parameters of the initializer's shapes (an init compile costs twice an apply's).
  rng = np.random.default_rng(0)
  params = jax.tree.map(lambda s: jnp.asarray(rng.normal(0, 0.3, s.shape), jnp.float32),
                        nn.unbox(jax.eval_shape(Encoder(c).init, jax.random.key(1), x, groups)))
  layers = params["params"]["layers"]
  # Scan steps of [local, lsh]: each slot holds its own kind's parameters only, stacked per step.
  assert sorted(layers["0"]["attention"]) == ["key", "output", "query", "value"]
  assert sorted(layers["1"]["attention"]) == ["output", "query_key", "value"]
  assert layers["1"]["attention"]["query_key"]["kernel"].shape == (num_layers // 2, H, HEADS, HEAD_DIM)
  got = jax.jit(Encoder(c).apply)(params, x, groups)
  want = jax.jit(lambda p, x, g: _one_by_one(c, p, x, g))(layers, x, groups)
  np.testing.assert_allclose(np.asarray(got), np.asarray(want), atol=1e-5)


def test_the_pattern_period_and_its_checks():
  enwik8 = ("local", "local", "lsh", "local") * 3  # transformers' reformer-enwik8 attn_layers
  c = EncoderConfig(vocab_size=10, hidden_size=H, num_layers=12, num_heads=HEADS, intermediate_size=32,
                    embedding_size=H, attention_kind="per_layer", attn_layers=enwik8)
  assert per_layer.period(c) == 4
  assert per_layer.period(dataclasses.replace(c, attn_layers=("lsh",) + ("local",) * 11)) == 12
  assert per_layer.period(dataclasses.replace(c, attn_layers=("local", "lsh"))) == 2
  # FLOPs per token are each layer's kind's; hand counts for H = 16 (2 x 8), 32 tokens, chunks of 8 and the one
  # before: local 4 projections 2 x 4 x 16 x 16 + scores and values over 16 keys 2 x 2 x 16 x 16 = 3072; lsh
  # 3 projections 1536 + rotations 2 x 16 x 2 rounds x 2 + 2 rounds x 2 x 2 x 16 x 16 = 3712.
  pattern = _pattern_config(2)
  assert [kinds.of(pattern, "attention").forward_flops(pattern, 32, i) for i in (0, 1)] == [3072, 3712]
  config = micro(**{"model.attention_kind": "per_layer", "model.attn_layers": "local,lsh,local"})
  with pytest.raises(UserError, match="model.attn_layers='local,lsh,local'; give a comma-separated list whose"):
    build.validate(config)
  config = micro(**{"model.attn_layers": "local,lsh"})
  with pytest.raises(UserError, match="for model.attention_kind=per_layer only"):
    build.validate(config)
  config = micro(**{"model.attention_kind": "per_layer", "model.attn_layers": "local,lsh", "model.num_buckets": "6,3"})
  with pytest.raises(UserError, match="model.num_buckets='6,3'.*even"):
    build.validate(config)


@pytest.mark.slow  # a train-step compile (~20 s on two cores); the blocks are checked against transformers above
def test_local_and_lsh_layers_train_on_padded_rows():
  config = micro(batch_size=4, seq_len=32, **{"model.attention_kind": "per_layer", "model.attn_layers": "local,lsh",
                                              "model.local_attn_chunk_length": 8, "model.lsh_attn_chunk_length": 8,
                                              "model.num_buckets": "4", "model.num_hashes": 2,
                                              "model.local_num_chunks_after": 1, "model.lsh_num_chunks_after": 1})
  build.validate(config)
  steps = build.make_steps(config, sharding.make_mesh("dp", devices=jax.devices()[:1]), SPM_SPECIAL)
  state = steps.init(jax.random.key(0))
  layers = state.params["encoder"]["layers"]
  assert set(layers) == {"0", "1"} and "query_key" in layers["1"]["attention"]
  rng = np.random.default_rng(0)
  ids = rng.integers(5, config.model.vocab_size, (4, 32)).astype(np.int32)
  groups = np.repeat(np.array([[1] * 28 + [0] * 4]), 4, axis=0).astype(np.int32)
  batch = dict(input_ids=ids, type_ids=np.zeros_like(ids), word_start=rng.random((4, 32)) < 0.7, groups=groups,
               position_ids=np.arange(32)[None].repeat(4, 0).astype(np.int32),
               sentence_label=np.zeros(4, np.int32), example_weight=np.ones(4, np.float32))
  before = jax.tree.map(np.asarray, layers)
  for _ in range(2):  # the first step's learning rate is 0 (warmup)
    state, metrics = steps.train(state, batch)
    assert np.isfinite(float(metrics["loss"].compute()))
  after = state.params["encoder"]["layers"]
  for slot, name in (("0", "key"), ("1", "query_key"), ("1", "value")):
    assert not np.array_equal(before[slot]["attention"][name]["kernel"],
                              np.asarray(after[slot]["attention"][name]["kernel"])), (slot, name)
