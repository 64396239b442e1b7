"""MobileBERT's layer (`model.layer=mobilebert`; Sun et al. 2020, arXiv:2004.02984), as transformers'
MobileBertLayer and google-research mobilebert modeling.py (transformer_model) compute it. The stream between
layers is H wide (the inter-block width); the blocks inside run at the bottleneck width b:

  li = norm(W_in x)                       (bottleneck_input: H -> b)
  qk = norm(W_qk x) if bottleneck_qk_shared; li with bottleneck_attention (MobileBERT-tiny); else x
  v  = li with bottleneck_attention, else x
  a  = norm(W_o attention(Q qk, K qk, V v) + li)          (no dropout on W_o's output, as with a bottleneck)
  a  = norm(a + FFN_j(a)) for j < num_ffn                 (FFN blocks of width b, no dropout)
  out = norm(dropout(W_out a) + x)        (bottleneck_output: b -> H)

The norm is the norm kind's (nonorm: MobileBERT's NoNorm; post: LayerNorm, the IB-BERT teacher). With neither
shared bottleneck nor bottleneck attention, queries and keys read x, as the reference code builds the teacher
(transformers' MobileBertSelfAttention cannot: it sizes them for b). Parameters live under the layer as
`bottleneck_input`(_ln), `bottleneck_attention`(_ln), `attention/{query,key,value,output,ln}`,
`ffn_{j}/{intermediate,output,ln}` and `bottleneck_output`(_ln).
"""

import dataclasses

import jax
from flax import linen as nn

from bertjax.core import sharding as sh
from bertjax.core.config import check as require
from bertjax.model import attention as attention_lib
from bertjax.model import ffn as ffn_lib
from bertjax.model import kinds, mha
from bertjax.model.dropout import token_dropout
from bertjax.model.layers import Block, dense, rows_at


def inner_config(c):
  """The config of the blocks inside the bottleneck: width b, and no dropout on their outputs."""
  return dataclasses.replace(c, hidden_size=c.bottleneck_size, dropout=0.0, head_size=0)


def reads(c) -> tuple[int, int]:
  """(width queries and keys read, width values read)."""
  b, h = c.bottleneck_size, c.hidden_size
  return (b if c.bottleneck_attention or c.bottleneck_qk_shared else h), (b if c.bottleneck_attention else h)


class BottleneckAttention(Block):
  """Multi-head attention inside the bottleneck (cfg: the inner config): queries and keys from `qk`, values from
  `v`, the output projection plus `residual` through the norm kind's norm."""

  @nn.compact
  def __call__(self, qk, v, residual, mask, head_gates=None):
    c = self.cfg
    proj = lambda x, n: dense(c, x.shape[-1], (c.num_heads, c.head_dim), (sh.EMBED, sh.HEADS, sh.KV), n)(x)
    q, k, v = proj(qk, "query"), proj(qk, "key"), proj(v, "value")
    if c.attention == "xla":
      # Scores, mask and softmax in float32 (as mha's).
      scores = mha.scores_of(q, k) * c.head_dim**-0.5 + mask
      probs = jax.nn.softmax(scores, axis=-1)
      self.sow("intermediates", "attention_probs", probs)
      self.sow("intermediates", "attention_scores", scores)  # progressive transfer's attention loss (compress/transfer.py)
      probs = token_dropout(c, c.attention_dropout, (2, 3))(probs, deterministic=self.deterministic)
      ctx = mha.context_of(probs.astype(c.dtype), v)
    else:
      ctx = attention_lib.fused(c.attention, q, k, v, mask, c.head_dim**-0.5, local=False,
                                half_window=0).astype(c.dtype)
    if head_gates is not None:
      ctx = ctx * head_gates.astype(ctx.dtype)[:, None]
    out = dense(c, (c.num_heads, c.head_dim), c.hidden_size, (sh.HEADS, sh.KV, sh.EMBED), "output", out=True)(ctx)
    return kinds.of(c, "norm").norm(c, "ln")(out + residual).astype(c.dtype)


class MobileBertLayer(Block):
  """One MobileBERT layer (the module docstring); called as bertjax.model.layer.Layer is."""

  @nn.compact
  def __call__(self, carry, layer_index, mask, shared, head_gates=None, positions=None, at=None):
    """`at`: optional [B, K] positions, the only ones returned (this layer computes every position)."""
    c, inner = self.cfg, inner_config(self.cfg)
    norm = kinds.of(c, "norm")
    x, state = carry  # the norm kind's carry and the attention kind's state (mha's: None), handed on as it came

    def bottleneck(name):
      y = dense(c, c.hidden_size, c.bottleneck_size, (sh.EMBED, None), name)(x)
      return norm.norm(c, name + "_ln", (None,))(y).astype(c.dtype)

    li = bottleneck("bottleneck_input")
    if c.bottleneck_attention:
      qk = v = li
    else:
      qk, v = (bottleneck("bottleneck_attention") if c.bottleneck_qk_shared else x), x
    h = BottleneckAttention(inner, self.deterministic, name="attention")(qk, v, li, mask, head_gates)
    for j in range(c.num_ffn):
      h = ffn_lib.FeedForward(inner, self.deterministic, name=f"ffn_{j}")(h)
    out = dense(c, c.bottleneck_size, c.hidden_size, (None, sh.EMBED), "bottleneck_output")(h)
    out = token_dropout(c, c.dropout)(out, deterministic=self.deterministic)
    out = norm.norm(c, "bottleneck_output_ln")(out + x).astype(c.dtype)
    out = nn.with_logical_constraint(out, (sh.BATCH, sh.LENGTH, sh.ACT_EMBED))
    self.sow("intermediates", "hidden", out)  # kept only when asked for (distillation's layer losses)
    return ((out if at is None else rows_at(out, at)), state), None


def check(m):
  """The model section's values a MobileBERT layer reads."""
  require(m.bottleneck_size > 0 and m.bottleneck_size % m.num_heads == 0,
          f"model.layer=mobilebert needs model.bottleneck_size (={m.bottleneck_size}) > 0 and divisible by "
          f"model.num_heads={m.num_heads}")
  require(m.num_ffn >= 1, f"model.num_ffn={m.num_ffn}; use 1 or more")
  require(m.norm in ("post", "nonorm"), f"model.layer=mobilebert places its norms after each block; "
          f"model.norm={m.norm!r} is not one of post, nonorm")
  require(m.sharing == "none" and m.attention_kind == "mha" and m.position == "learned",
          "model.layer=mobilebert has no cross-layer sharing, mha attention and learned positions; "
          "set model.sharing=none, attention_kind=mha, position=learned")


def forward_flops(c, seq_len: int) -> float:
  """Forward matmul FLOPs per token of one MobileBERT layer: the bottlenecks, q/k/v from the widths they read,
  scores and values over the row, the output projection and the num_ffn FFNs at width b."""
  h, b = c.hidden_size, c.bottleneck_size
  qk, v = reads(c)
  shared = 2 * h * b if c.bottleneck_qk_shared and not c.bottleneck_attention else 0
  ffn = c.num_ffn * kinds.of(c, "ffn").forward_flops(inner_config(c))
  return 2 * h * b + shared + 2 * (2 * qk + v) * b + 2 * 2 * seq_len * b + 2 * b * b + ffn + 2 * b * h
