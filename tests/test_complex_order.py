"""Complex-order embeddings (bertjax.model.complex_order): the embedding equation and its offset property, the
authors' frequency initialization and position count, and the embeddings the real encoder reads."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from bertjax.core.errors import UserError
from bertjax.model import complex_order
from bertjax.model.embeddings import Embeddings
from bertjax.model.hparams import EncoderConfig


def test_embedding_is_r_exp_i_omega_pos_and_an_offset_rotates_it():
  rng = np.random.default_rng(0)
  r, omega = rng.normal(size=(1, 6)), rng.uniform(0.1, 2.0, size=(1, 6))
  pos, n = np.array([3.0]), 5.0
  real, imag = (np.asarray(v, np.float64) for v in complex_order.complex_embedding(r, omega, pos))
  np.testing.assert_allclose(real + 1j * imag, r * np.exp(1j * omega * 3.0), rtol=1e-6)
  # The offset property (spec sheet §7 (f)): f(j, pos + n) = exp(i omega_j n) f(j, pos).
  shifted = complex_order.complex_embedding(r, omega, pos + n)
  np.testing.assert_allclose(np.asarray(shifted[0]) + 1j * np.asarray(shifted[1]),
                             np.exp(1j * omega * n) * (real + 1j * imag), rtol=1e-5, atol=1e-6)


def test_frequencies_start_as_the_authors_sinusoid_table_for_every_word():
  table = np.asarray(complex_order.initial_frequencies(None, (3, 8)))
  want = [1.0, 1.0, 0.1, 0.1, 0.01, 0.01, 0.001, 0.001]  # 1 / 10000^(2 floor(k / 2) / 8)
  np.testing.assert_allclose(table, np.broadcast_to(want, (3, 8)), rtol=1e-6)


CFG = EncoderConfig(vocab_size=20, hidden_size=8, num_layers=1, num_heads=2, intermediate_size=16, embedding_size=8,
                    type_vocab_size=0, position="complex_order")


def test_the_encoder_reads_real_parts_on_even_and_imaginary_parts_on_odd_dimensions():
  ids = jnp.array([[3, 5, 7, 9]])
  emb = Embeddings(CFG)
  params = nn.unbox(emb.init(jax.random.key(0), ids, jnp.zeros_like(ids), True))
  assert set(params["params"]) == {"word", "frequency", "ln"}  # the frequency table replaces the position table
  word, freq = (np.asarray(params["params"][k]) for k in ("word", "frequency"))
  for counting, pos in (("descending", [3.0, 2.0, 1.0, 0.0]), ("ascending", [0.0, 1.0, 2.0, 3.0])):
    cfg = dataclasses.replace(CFG, complex_positions=counting, layer_norm_eps=1e-12)
    got = np.asarray(Embeddings(cfg).apply(params, ids, jnp.zeros_like(ids), True))
    phase = freq[ids[0]] * np.array(pos)[:, None]
    parts = np.where(np.arange(8) % 2 == 0, word[ids[0]] * np.cos(phase), word[ids[0]] * np.sin(phase))
    mean, var = parts.mean(-1, keepdims=True), parts.var(-1, keepdims=True)
    np.testing.assert_allclose(got[0], (parts - mean) / np.sqrt(var + 1e-12), rtol=1e-4, atol=1e-5)
  # Ascending positions restart per packed example (position_ids), as the paper counts them.
  cfg = dataclasses.replace(CFG, complex_positions="ascending")
  packed = np.asarray(Embeddings(cfg).apply(params, ids, jnp.zeros_like(ids), True, jnp.array([[0, 1, 0, 1]])))
  alone = np.asarray(Embeddings(cfg).apply(params, ids[:, 2:], jnp.zeros_like(ids[:, 2:]), True))
  np.testing.assert_allclose(packed[:, 2:], alone, rtol=1e-6)


def test_config_checks():
  from bertjax.core.config import defaults
  from bertjax.model import config as model_config

  c = defaults()
  c.model.position, c.model.complex_positions = "complex_order", "sideways"
  with pytest.raises(UserError, match="model.complex_positions='sideways'; use one of descending, ascending"):
    model_config.validate(c)


def test_modulus_attention_of_two_tokens_is_the_unconjugated_product():
  # Two tokens, one head of width 2: Q = [[1+2i, 0+1i], [2+0i, 1-1i]], K = [[1+0i, 1+1i], [0+1i, 2+0i]].
  q = np.array([[1 + 2j, 1j], [2, 1 - 1j]])
  k = np.array([[1, 1 + 1j], [1j, 2]])
  want = np.abs(q @ k.T)  # no conjugate: q . k, not q . conj(k)
  assert not np.allclose(want, np.abs(q @ k.conj().T))
  part = lambda z: jnp.asarray(z, jnp.float32)[None, :, None, :]
  got = np.asarray(complex_order.modulus_scores(part(q.real), part(q.imag), part(k.real), part(k.imag)))[0, 0]
  np.testing.assert_allclose(got, want, rtol=1e-6)
  # By hand: q0.k0 = (1+2i) + i(1+i) = 3i, q0.k1 = (1+2i)i + 2i = -2+3i, q1.k0 = 2 + (1-i)(1+i) = 4, q1.k1 = 2i + 2(1-i) = 2.
  np.testing.assert_allclose(got, [[3, np.sqrt(13)], [4, 2]], rtol=1e-6)


def test_complex_attention_encoder_trains_and_refuses_fused_kernels():
  from bertjax.core.config import defaults
  from bertjax.model import config as model_config
  from bertjax.model.encoder import Encoder

  cfg = dataclasses.replace(CFG, attention_kind="complex_order", num_layers=1, dropout=0.0, attention_dropout=0.0)
  x, groups = jax.random.normal(jax.random.key(0), (2, 5, 8)), jnp.array([[1] * 5, [1] * 3 + [0] * 2])
  params = Encoder(cfg).init(jax.random.key(1), x, groups)
  assert params["params"]["layers"]["attention"]["query"]["kernel"].value.shape == (1, 4, 2, 2)  # half width in
  loss = lambda p: jnp.sum(Encoder(cfg).apply(p, x, groups)[:, :3] ** 2)
  grads = jax.grad(loss)(params)
  assert all(np.isfinite(np.asarray(g)).all() for g in jax.tree.leaves(grads))
  assert float(jnp.abs(grads["params"]["layers"]["attention"]["query"]["kernel"].value).sum()) > 0
  c = defaults()
  c.model.attention_kind, c.model.attention, c.model.attention_dropout, c.model.dtype = \
      "complex_order", "splash", 0.0, "bfloat16"
  with pytest.raises(UserError, match="complex_order takes the modulus.*use --config.model.attention=xla"):
    model_config.validate(c)
