"""The Reformer's parts (bertjax.model.reformer, reversible, axial): the reversible stack's custom VJP gives plain
autodiff's gradients (dropout on) and needs less compiled temporary memory than remat=full; the chunked FFN computes
the same values; axial rows are cat(w0[p // d2], w1[p % d2]) and refuse the lengths transformers refuses."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from bertjax.core.errors import UserError
from bertjax.model import axial, config as model_config, layer_kinds, reversible  # noqa: F401  (the kinds register)
from bertjax.model.encoder import Encoder
from bertjax.model.hparams import EncoderConfig
from bertjax.model.pretrain import Pretrainer
from bertjax.train import build
from conftest import load_config

B, S = 2, 16
TINY = EncoderConfig(vocab_size=50, hidden_size=32, num_layers=2, num_heads=2, intermediate_size=64, embedding_size=32,
                     max_positions=S, type_vocab_size=0, dropout=0.1, attention_dropout=0.1, layer="reformer",
                     norm="reversible", mlm_decoder="untied", use_bias=False, position="axial", axial_pos_shape=(4, 4),
                     axial_pos_embds_dim=(16, 16), chunk_size_feed_forward=4)


def _batch(seed=0):
  rng = np.random.default_rng(seed)
  return dict(input_ids=jnp.asarray(rng.integers(0, 50, (B, S))), type_ids=jnp.zeros((B, S), jnp.int32),
              groups=jnp.ones((B, S), jnp.int32), mlm_positions=jnp.asarray(rng.integers(0, S, (B, 4))))


@pytest.fixture(scope="module")
def tiny():
  """(params, loss(params, cfg), batch) of the tiny Reformer in train mode (dropout on, a fixed dropout key)."""
  batch = _batch()
  init = jax.jit(Pretrainer(TINY, deterministic=False).init)
  params = nn.unbox(init({"params": jax.random.key(0), "dropout": jax.random.key(1)}, batch)["params"])

  def loss(p, cfg):
    out = Pretrainer(cfg, deterministic=False).apply({"params": p}, batch, rngs={"dropout": jax.random.key(2)})
    return jnp.mean(out["mlm_logits"] ** 2)

  return params, loss, batch


def test_reversible_gradients_equal_plain_autodiff(tiny):
  params, loss, _ = tiny
  l_rev, g_rev = jax.jit(jax.value_and_grad(lambda p: loss(p, TINY)))(params)
  l_plain, g_plain = jax.jit(jax.value_and_grad(lambda p: loss(p, dataclasses.replace(TINY, reversible=False))))(params)
  assert float(l_rev) == pytest.approx(float(l_plain), rel=1e-6)
  rel = jax.tree.leaves(jax.tree.map(lambda a, b: float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b)), g_rev, g_plain))
  assert max(rel) < 1e-5
  # Every layer's every block gets a gradient (the recomputation reaches the first layer's attention).
  first = g_rev["encoder"]["layers"]["layer_0"]
  assert float(jnp.abs(first["attention"]["self"]["query"]["kernel"]).sum()) > 0
  assert float(jnp.abs(first["ffn"]["chunk"]["intermediate"]["kernel"]).sum()) > 0


def test_parameters_are_transformers_reformer_layers(tiny):
  params, _, _ = tiny
  layer = params["encoder"]["layers"]["layer_0"]
  assert set(layer["attention"]["self"]) == {"query", "key", "value", "output"}  # no biases (use_bias=False)
  assert "bias" not in layer["attention"]["self"]["query"]
  assert set(layer["ffn"]["chunk"]["output"]) == {"kernel", "bias"}  # the FFN keeps its biases
  assert params["encoder"]["layers"]["ln"]["scale"].shape == (64,)  # the norm over both streams
  assert params["mlm"]["decoder"]["kernel"].shape == (64, 50)  # untied 2H -> V
  assert "ln" not in params["embeddings"] and "type" not in params["embeddings"]


def test_reversible_stack_needs_less_temp_memory_than_remat_full():
  # Local attention (chunks of 32): the L stored layer inputs that remat=full keeps, and the reversible stack does
  # not, outweigh one layer's recomputation (with dense attention at short rows its [S, S] arrays are the larger:
  # docs/results.md, long rows).
  c = dataclasses.replace(TINY, num_layers=4, dropout=0.0, attention_dropout=0.0, chunk_size_feed_forward=0,
                          max_positions=256, attention_kind="local", local_attn_chunk_length=32,
                          local_num_chunks_after=1)
  x, groups = jnp.ones((1, 256, 32)), jnp.ones((1, 256), jnp.int32)
  params = nn.unbox(jax.jit(Encoder(c).init)(jax.random.key(0), x, groups)["params"])

  def temp(cfg):
    grad = jax.jit(jax.grad(lambda p, x: jnp.sum(Encoder(cfg).apply({"params": p}, x, groups) ** 2), argnums=(0, 1)))
    return grad.lower(params, x).compile().memory_analysis().temp_size_in_bytes

  rev, full = temp(c), temp(dataclasses.replace(c, reversible=False, remat="full"))
  assert rev < 0.85 * full


def test_chunked_feed_forward_computes_the_same_values(tiny):
  params, _, batch = tiny
  run = lambda size: Pretrainer(dataclasses.replace(TINY, chunk_size_feed_forward=size)).apply(
      {"params": params}, batch)["mlm_logits"]
  whole = run(0)
  for size in (4, 8, S):
    np.testing.assert_allclose(run(size), whole, atol=1e-6)
  with pytest.raises(UserError, match="chunk_size_feed_forward=5 does not divide"):
    run(5)


def test_axial_rows_and_refusals():
  w0 = jnp.arange(4 * 2, dtype=jnp.float32).reshape(4, 2)
  w1 = 100 + jnp.arange(3 * 1, dtype=jnp.float32).reshape(3, 1)
  p = jnp.arange(12)[None]
  got = np.asarray(axial.rows((w0, w1), p, 3))[0]
  for i in range(12):
    assert list(got[i]) == [*np.asarray(w0[i // 3]), *np.asarray(w1[i % 3])]
  with pytest.raises(UserError, match="longer than the axial positions"):
    axial.Axial().embed(TINY, (w0, w1), 17, None)
  config = load_config("configs/reformer.py:tiny")
  build.validate(config)  # seq_len 128 = 8 x 16
  config.seq_len = 64
  with pytest.raises(UserError, match="seq_len=64: axial positions train at exactly d1 x d2 = 128"):
    model_config.validate(config)
  config.seq_len, config.data.format = 128, "packed"
  with pytest.raises(UserError, match="data.format=packed restarts positions"):
    model_config.validate(config)


@pytest.mark.parametrize("variant,count", [("enwik8", 149_182_980), ("mlm_base", 151_885_940)])
def test_parameter_counts_equal_transformers(variant, count):
  # ReformerModelWithLMHead (google/reformer-enwik8's config) and the BERT-base-like ReformerForMaskedLM, counted
  # under torch.device("meta") in the spec sheet (mobilebert_reformer.md, section 3.6).
  shapes = build.param_shapes(load_config(f"configs/reformer.py:{variant}"))
  assert sum(x.size for x in jax.tree.leaves(shapes)) == count


@pytest.mark.slow  # LSH's compile (12 s on the shared machine); the normal tier keeps the dense case above
def test_reversible_lsh_reuses_its_buckets_and_gives_plain_autodiff_gradients(monkeypatch):
  # Rotations drawn from the dropout keys (no hash_seed), dropout on: the backward pass hands every LSH layer the
  # buckets its forward pass hashed (the lsh_buckets collection), as transformers reuses its cached buckets.
  c = dataclasses.replace(TINY, attention_kind="lsh", lsh_attn_chunk_length=8, num_hashes=2, num_buckets=(4,),
                          max_positions=32, chunk_size_feed_forward=0)
  x, groups = jax.random.normal(jax.random.key(3), (B, 32, 32)), jnp.ones((B, 32), jnp.int32)
  rngs = {"params": jax.random.key(0), "dropout": jax.random.key(1)}
  params = nn.unbox(jax.jit(Encoder(c, False).init)(rngs, x, groups)["params"])
  captured = []
  sown = reversible._sown_buckets
  monkeypatch.setattr(reversible, "_sown_buckets", lambda s: captured.append(sown(s)) or captured[-1])
  loss = lambda p, cfg: jnp.sum(Encoder(cfg, False).apply({"params": p}, x, groups,
                                                          rngs={"dropout": jax.random.key(2)}) ** 2)
  g_rev = jax.jit(jax.grad(lambda p: loss(p, c)))(params)
  kept = [b["self"]["buckets"].shape for b in captured if "self" in b]  # (the helper also sees inner scopes)
  assert kept == [(B, 2, 2, 32)] * 2  # both layers' buckets kept for the backward pass
  g_plain = jax.jit(jax.grad(lambda p: loss(p, dataclasses.replace(c, reversible=False))))(params)
  rel = jax.tree.leaves(jax.tree.map(lambda a, b: float(jnp.linalg.norm(a - b) / jnp.linalg.norm(b)), g_rev, g_plain))
  assert max(rel) < 1e-5
