"""The Reformer's layer (Kitaev, Kaiser, Levskaya, ICLR 2020; `model.layer=reformer`, `model.norm=reversible`), as
transformers' ReformerLayer computes it (models/reformer/modeling_reformer.py, 5.24):

  Y1 = X1 + Attn(X2),   Attn = LayerNorm -> the attention kind's block (q/k/v and output without bias) -> dropout
  Y2 = X2 + FFN(Y1),    FFN  = LayerNorm -> Linear(H -> F) -> dropout -> activation -> Linear(F -> H) -> dropout

(dropout before the activation, as ReformerFeedForwardDense). The two streams both start as the embeddings
(ReformerEncoder's cat([h, h])), run as a reversible stack (bertjax.model.reversible) and end in a LayerNorm over
their concatenation [B, S, 2H] and dropout: the encoder's output is 2H wide, read by the untied MLM decoder
(`model.mlm_decoder=untied`, ReformerOnlyLMHead). `model.chunk_size_feed_forward` runs the FFN over the sequence
in chunks of that many positions (transformers' apply_chunking_to_forward): the same values; it saves memory only
where the FFN is recomputed (the reversible stack's backward pass, remat), as in transformers.

The `reversible` norm kind places no norm of its own: the embeddings have none (ReformerEmbeddings), the layer's
norms are its blocks', and the stack ends in the norm over both streams. Parameters live under
`layer_{i}/attention/{ln, self/<the attention kind's>}` and `layer_{i}/ffn/{ln, intermediate, output}`.
"""

import dataclasses

import jax.numpy as jnp
from flax import linen as nn

from bertjax.core import sharding as sh
from bertjax.core.config import check
from bertjax.core.errors import UserError
from bertjax.model import kinds
from bertjax.model.dropout import token_dropout
from bertjax.model.layers import activation, Block, dense, layer_norm
from bertjax.model.norms import Post


@kinds.register("norm", "reversible")
class Reversible(Post):
  """The Reformer's placement: the carry is the two streams, the blocks own their norms, the stack the last."""

  hf_family = "reformer"

  def check(self, m):
    check(m.layer == "reformer", "model.norm=reversible is the Reformer layer's; set model.layer=reformer")

  def norm(self, c, name, names=(sh.EMBED,)):
    return lambda x: x  # the embeddings' norm: ReformerEmbeddings has none

  def start(self, x):
    return (x, x)  # X1 = X2 = the embeddings (ReformerEncoder: cat([h, h]))

  def attention_output(self, c, xq, out):
    return out.astype(c.dtype)  # the layer adds the residual (Y1 = X1 + Attn(X2))

  def output(self, carry):
    return carry  # the stack has normalized the concatenated streams


def _biased(c):
  """The config of the FFN and the norms: transformers' Reformer gives them biases (its attention has none)."""
  return dataclasses.replace(c, use_bias=True)


class ReformerAttention(Block):
  """F: LayerNorm, then the attention kind's block (its output projection and dropout included)."""

  @nn.compact
  def __call__(self, x, mask, positions=None, layer_index=0):
    c = self.cfg
    h = layer_norm(_biased(c), "ln")(x).astype(c.dtype)
    layer_c, layer_mask = kinds.of(c, "attention").layer_kind(c, layer_index, mask)  # a per-layer pattern's kind
    block = kinds.of(layer_c, "attention").block
    return block(layer_c, self.deterministic, name="self")(h, layer_mask, None, positions, layer_index)


class FeedForwardChunk(Block):
  """G on one chunk of positions: LayerNorm -> dense -> dropout -> activation -> dense -> dropout. Called as a
  scan body, (carry, chunk) -> (carry, output), the carry unused."""

  @nn.compact
  def __call__(self, carry, x):
    c = _biased(self.cfg)
    h = layer_norm(c, "ln")(x).astype(c.dtype)
    h = dense(c, c.hidden_size, c.intermediate_size, (sh.EMBED, sh.MLP), "intermediate")(h)
    h = token_dropout(c, c.dropout)(h, deterministic=self.deterministic)
    h = activation(c, h)
    h = dense(c, c.intermediate_size, c.hidden_size, (sh.MLP, sh.EMBED), "output", out=True)(h)
    return carry, token_dropout(c, c.dropout)(h, deterministic=self.deterministic)


class ReformerFeedForward(Block):
  """G over the sequence, in chunks of `chunk_size_feed_forward` positions when set (one parameter set)."""

  @nn.compact
  def __call__(self, x, mask=None, positions=None, layer_index=0):
    c = self.cfg
    b, s, h = x.shape
    size = c.chunk_size_feed_forward
    if not size or size >= s:
      return FeedForwardChunk(c, self.deterministic, name="chunk")(None, x)[1]
    if s % size:
      raise UserError(f"model.chunk_size_feed_forward={size} does not divide the sequence length {s}; "
                      "use a divisor of it (or 0: no chunks)")
    chunks = nn.scan(FeedForwardChunk, variable_broadcast="params", split_rngs={"params": False, "dropout": True},
                     in_axes=1, out_axes=1, length=s // size)
    _, out = chunks(c, self.deterministic, name="chunk")(None, x.reshape(b, s // size, size, h))
    return out.reshape(b, s, h)


class ReformerLayer(Block):
  """One layer over the two streams (the module docstring); called as bertjax.model.layer.Layer is. The stack
  (bertjax.model.reversible) runs its blocks as functions of their parameters; this module makes them."""

  @nn.compact
  def __call__(self, carry, layer_index, mask, shared, head_gates=None, positions=None, at=None):
    (x1, x2), state = carry
    c = self.cfg
    y1 = x1 + ReformerAttention(c, self.deterministic, name="attention")(x2, mask, positions, layer_index)
    y2 = x2 + ReformerFeedForward(c, self.deterministic, name="ffn")(y1)
    return ((y1.astype(jnp.float32), y2.astype(jnp.float32)), state), None


def check_model(m):
  """The model section's values a Reformer layer reads."""
  check(m.norm == "reversible", f"model.layer=reformer keeps two streams; set model.norm=reversible (not {m.norm!r})")
  check(m.sharing == "none", "model.layer=reformer has no cross-layer sharing; set model.sharing=none")
  check(m.chunk_size_feed_forward >= 0, f"model.chunk_size_feed_forward={m.chunk_size_feed_forward}; use 0 or more")
  check(m.mlm_decoder == "untied", "model.layer=reformer ends in 2 x hidden_size, which only the untied decoder reads; "
        "set model.mlm_decoder=untied")


def forward_flops(c, seq_len: int, index: int) -> float:
  """Forward matmul FLOPs per token of one Reformer layer: its attention kind's and the FFN's two matmuls."""
  return kinds.of(c, "attention").forward_flops(c, seq_len, index) + 2 * 2 * c.hidden_size * c.intermediate_size
