"""Pretraining heads: MLM over gathered positions (tied decoder + bias), pooler + sentence head, RTD head."""

import jax.numpy as jnp
from flax import linen as nn

from bertjax import sharding as sh
from bertjax.model.encoder import EncoderConfig, _zeros, activation, dense, layer_norm


def gather_positions(hidden, positions):
  """hidden [B, S, H] at positions [B, P] -> [B, P, H]; MLM only decodes the masked slots."""
  return jnp.take_along_axis(hidden, positions[..., None], axis=1)


class MLMHead(nn.Module):
  """BERT's MLM transform (dense H->E, GELU, LayerNorm in E); the caller applies the tied decoder."""

  cfg: EncoderConfig

  @nn.compact
  def __call__(self, hidden, positions, embeddings):
    c = self.cfg
    x = gather_positions(hidden, positions)
    x = dense(c, c.hidden_size, c.embedding_size, (sh.EMBED, None), "transform")(x)
    x = layer_norm(c, "ln", names=(None,))(activation(c, x))
    bias = self.param("bias", _zeros((sh.VOCAB,)), (c.vocab_size,))
    # Decoder in the compute dtype, logits and loss in float32.
    return embeddings.attend(x.astype(c.dtype)).astype(jnp.float32) + bias


class SentenceHead(nn.Module):
  """Tanh pooler over [CLS] and a 2-way classifier; NSP and SOP share it."""

  cfg: EncoderConfig

  @nn.compact
  def __call__(self, hidden):
    c = self.cfg
    pooled = jnp.tanh(dense(c, c.hidden_size, c.hidden_size, (sh.EMBED, None), "pooler")(hidden[:, 0]))
    return dense(c, c.hidden_size, 2, (sh.EMBED, None), "classifier")(pooled).astype(jnp.float32)


class RTDHead(nn.Module):
  """ELECTRA's discriminator head: dense-GELU then one logit per token ("replaced")."""

  cfg: EncoderConfig

  @nn.compact
  def __call__(self, hidden):
    c = self.cfg
    x = activation(c, dense(c, c.hidden_size, c.hidden_size, (sh.EMBED, None), "transform")(hidden))
    return dense(c, c.hidden_size, 1, (sh.EMBED, None), "logit")(x)[..., 0].astype(jnp.float32)
