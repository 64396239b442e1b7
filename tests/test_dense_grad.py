"""model.dense_grad=transposed (bertjax.model.encoder.matmul_pretransposed) computes the same gradients as the
plain dense layer's autodiff, through a whole encoder and the tied MLM decoder."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from bertjax.core.errors import UserError
from bertjax.model import config as model_config
from bertjax.model.embeddings import Embeddings
from bertjax.model.encoder import Encoder
from bertjax.model.layers import matmul_pretransposed, tokens_matmul
from conftest import micro


def test_pretransposed_matmul_has_the_plain_gradients():
  x = jax.random.normal(jax.random.key(0), (2, 5, 6))
  w = jax.random.normal(jax.random.key(1), (6, 3, 4))  # a multi-axis kernel, flattened as the layers do
  loss = lambda grad: lambda x, w: jnp.sum(jnp.sin(tokens_matmul(x, w, 1, grad=grad)))
  plain = jax.grad(loss("xla"), argnums=(0, 1))(x, w)
  ours = jax.grad(loss("transposed"), argnums=(0, 1))(x, w)
  for a, b in zip(plain, ours):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)
  assert jnp.allclose(matmul_pretransposed(x[0], w.reshape(6, 12)), x[0] @ w.reshape(6, 12))


class _EncodeDecode(nn.Module):
  """Embeddings, the scanned encoder layers and the tied MLM decoder: every dense layer kind bertjax has."""

  cfg: object

  @nn.compact
  def __call__(self, ids, groups):
    emb = Embeddings(self.cfg)
    return emb.attend(Encoder(self.cfg)(emb(ids, jnp.zeros_like(ids), True), groups))


@pytest.mark.slow  # ~5 s: three compiles of a scanned encoder (the matmul-level test above is the normal tier's)
def test_dense_grad_switch_keeps_an_encoders_gradients():
  config = micro("configs/bert.py:tiny")
  config.model.update(hidden_size=32, num_heads=2, intermediate_size=64, num_layers=2, dropout=0.0,
                      attention_dropout=0.0, vocab_size=97)
  cfg = model_config.encoder_config(config.model)
  assert cfg.dense_grad == "xla"  # the default
  ids = jax.random.randint(jax.random.key(2), (2, 16), 5, 97)
  groups = jnp.ones_like(ids)
  params = jax.jit(_EncodeDecode(cfg).init)(jax.random.key(0), ids, groups)

  def grads(c):
    return jax.jit(jax.grad(lambda p: jnp.sum(jnp.sin(_EncodeDecode(c).apply(p, ids, groups)))))(params)

  plain, ours = grads(cfg), grads(dataclasses.replace(cfg, dense_grad="transposed"))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), plain, ours)
  assert len(jax.tree.leaves(plain)) > 10


def test_dense_grad_rejects_an_unknown_value():
  config = micro("configs/bert.py:tiny")
  config.model.dense_grad = "fast"
  with pytest.raises(UserError, match="model.dense_grad"):
    model_config.validate(config)
