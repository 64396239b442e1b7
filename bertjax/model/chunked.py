"""The `local` attention kind: Reformer's chunked local self-attention as transformers 5.24 writes it
(models/reformer/modeling_reformer.py, LocalSelfAttention), and the chunk helpers the `lsh` kind
(bertjax.model.lsh) shares with it.

A row of S tokens is cut into chunks of `local_attn_chunk_length`; a query reads the keys of its own chunk and of
`local_num_chunks_before` / `local_num_chunks_after` neighbouring chunks, circularly (transformers'
`_look_adjacent`: the chunk before chunk 0 is the last one). Queries, keys and values come from three projections
without bias and keys are divided by sqrt(head_dim); there is no self-mask. A masked key's score is *replaced* by
-1e9 (transformers' torch.where, so a row without any allowed key spreads evenly): a padding key, a key of another
packed example than the query's (`groups`), and with `model.causal` (transformers' is_decoder) a key after the
query. A row no longer than one chunk runs plain attention with the same masks. On unpacked rows (groups = the
padding mask) the output equals transformers' at every position, padding included: a padding query reads the real
keys, as transformers' key-only mask lets it. The output projection has no bias either (ReformerSelfOutput).

No fused kernel computes this: model.attention must be auto or xla.
"""

import jax
import jax.numpy as jnp
from flax import linen as nn

from bertjax.core import sharding as sh
from bertjax.core.config import check
from bertjax.core.errors import UserError
from bertjax.model import kinds, mha
from bertjax.model.dropout import token_dropout
from bertjax.model.layers import Block, dense

MASK = -1e9  # transformers' mask_value_float32 (scores are float32 here whatever the compute dtype)


def dropout_rate(c, rate: float) -> float:
  """A kind's attention-probability dropout: its own rate, or model.attention_dropout when negative."""
  return rate if rate >= 0 else c.attention_dropout


def chunked(x, axis: int, length: int):
  """x with axis `axis` (a multiple of `length` long) cut into [n chunks, length]."""
  n = x.shape[axis] // length
  return x.reshape(x.shape[:axis] + (n, length) + x.shape[axis + 1:])


def look_adjacent(x, before: int, after: int, axis: int):
  """Chunks along `axis` -> each chunk followed by its neighbours: chunks i - before .. i + after (circular)
  concatenated along axis + 1, transformers' `_look_adjacent`."""
  if before == 0 and after == 0:
    return x
  return jnp.concatenate([jnp.roll(x, -i, axis) for i in range(-before, after + 1)], axis=axis + 1)


def allowed(q_groups, k_groups, q_pos, k_pos, causal: bool):
  """Whether a query may read a key (shapes broadcast): the key is real and, for a real query, of the query's
  packed example (a padding query reads every real key, as transformers' key-only mask lets it); with `causal`,
  the key is not after the query."""
  ok = (k_groups > 0) & ((k_groups == q_groups) | (q_groups == 0))
  return ok & (q_pos >= k_pos) if causal else ok


def attend(q, k, v, ok, drop, self_mask=None, self_value: float = 0.0):
  """Softmax attention of q [..., Q, D] over k, v [..., K, D] with float32 scores: scores where `ok` is False are
  replaced by -1e9, then those where `self_mask` is True by `self_value` (LSH's self-mask). `drop`: the dropout of
  the probabilities. Returns (output [..., Q, D], the rows' logsumexp [..., Q])."""
  dots = jnp.einsum("...qd,...kd->...qk", q, k, preferred_element_type=jnp.float32)
  dots = jnp.where(ok, dots, MASK)
  if self_mask is not None:
    dots = jnp.where(self_mask, self_value, dots)
  lse = jax.nn.logsumexp(dots, axis=-1, keepdims=True)
  probs = drop(jnp.exp(dots - lse))
  return jnp.einsum("...qk,...kd->...qd", probs.astype(v.dtype), v), lse[..., 0]


def local_attention(q, k, v, groups, length: int, before: int, after: int, causal: bool, drop):
  """transformers' LocalSelfAttention after its projections: q, k (already scaled), v [B, H, S, D], groups
  [B, S] -> [B, H, S, D]."""
  s = q.shape[2]
  pos = jnp.arange(s)
  if s <= length:  # one chunk: plain attention
    return attend(q, k, v, allowed(groups[:, None, :, None], groups[:, None, None, :], pos[:, None], pos, causal),
                  drop)[0]
  if s % length:
    raise UserError(f"a row of {s} tokens does not split into chunks of model.local_attn_chunk_length={length}; "
                    "use a seq_len that is a multiple of it")
  adjacent = lambda x, axis: look_adjacent(chunked(x, axis, length), before, after, axis)
  g = chunked(groups, 1, length)[:, None]  # [B, 1, n, c]
  ok = allowed(g[..., None], adjacent(groups, 1)[:, None, :, None, :], chunked(pos, 0, length)[..., None],
               adjacent(pos, 0)[:, None, :], causal)  # [B, 1, n, c, W]
  out, _ = attend(chunked(q, 2, length), adjacent(k, 2), adjacent(v, 2), ok, drop)
  return out.reshape(q.shape)


def projection(c, name: str):
  """A [H] -> [heads, head_dim] projection without bias (transformers' Reformer attentions have none)."""
  return dense(c, c.hidden_size, (c.num_heads, c.head_dim), (sh.EMBED, sh.HEADS, sh.KV), name, False)


def heads_first(x):
  """[B, S, heads, D] -> [B, heads, S, D]."""
  return jnp.swapaxes(x, 1, 2)


def probs_dropout(module, rate: float):
  """The dropout of attention probabilities of a chunked kind (their chunk axes are no sequence axes)."""
  drop = token_dropout(module.cfg, rate, ())
  return lambda p: drop(p, deterministic=module.deterministic)


def block_output(module, x, ctx, head_gates):
  """The block's result from the heads' context ctx [B, heads, S, D], in the calling module's scope: heads gated
  (bertjax.compress.prune), the output projection without bias (ReformerSelfOutput), dropout, then the residual and
  norm the norm kind places."""
  c = module.cfg
  ctx = heads_first(ctx).astype(c.dtype)
  if head_gates is not None:  # 0 removes a head exactly
    ctx = ctx * head_gates.astype(ctx.dtype)[:, None]
  out = dense(c, (c.num_heads, c.head_dim), c.hidden_size, (sh.HEADS, sh.KV, sh.EMBED), "output", False, out=True)(ctx)
  out = token_dropout(c, c.dropout)(out, deterministic=module.deterministic)
  return kinds.of(c, "norm").attention_output(c, x, out)


class LocalAttention(Block):
  """Reformer's local (chunked) self-attention: parameters `query`, `key`, `value` [H, heads, head_dim] and
  `output` [heads, head_dim, H], all without bias."""

  @nn.compact
  def __call__(self, x, mask, head_gates=None, positions=None, layer_index=0, at=None):
    """`x` [B, S, H]: the norm kind's attention input; `mask`: the rows' groups [B, S] (what `Local.mask` makes);
    the other arguments are MultiHeadAttention's (`at` is not supported: the kind does not compute rows)."""
    assert at is None, "local attention computes every position (Local.computes_rows is False)"
    c = self.cfg
    q, k, v = (heads_first(projection(c, name)(x)) for name in ("query", "key", "value"))
    k = k / jnp.sqrt(jnp.float32(c.head_dim)).astype(k.dtype)
    ctx = local_attention(q, k, v, mask, c.local_attn_chunk_length, c.local_num_chunks_before,
                          c.local_num_chunks_after, c.causal,
                          probs_dropout(self, dropout_rate(c, c.local_attention_dropout)))
    return block_output(self, x, ctx, head_gates)

  @staticmethod
  def init_args(c, x):
    """Arguments that initialize the block alone (ALBERT's shared blocks): one example."""
    return (x, jnp.ones(x.shape[:2], jnp.int32))


def check_chunked(m, name: str, length: int, before: int, after: int):
  """The checks every chunked kind makes of the model section: xla attention, no rotary positions, a positive
  chunk length and non-negative neighbour counts."""
  check(m.attention in ("auto", "xla"), f"model.attention_kind={name} has no fused kernel, so model.attention="
        f"{m.attention} cannot run it; use --config.model.attention=xla")
  check(m.position != "rope", f"model.attention_kind={name} has no rotary positions; use --config.model.position="
        "learned (or a position kind that adds to the embeddings)")
  check(length > 0 and before >= 0 and after >= 0, f"model.attention_kind={name}: its chunk length ({length}) must "
        f"be positive and its chunks before/after ({before}, {after}) at least 0")


class Chunked(mha.AttentionKind):
  """What the chunked kinds (local, lsh) share: every row computed, the xla implementation only, the groups as the
  mask, and Reformer's weights."""

  computes_rows = False  # a chunk reads its neighbours: no [CLS]-only last layer
  fused = False
  hf_family = "reformer"  # transformers holds these attentions in its Reformer only

  def mask(self, c, groups):
    """The rows' groups [B, S] (0: padding; one id per packed example), as every layer reads them."""
    return groups


@kinds.register("attention", "local")
class Local(Chunked):
  """Reformer's local (chunked) self-attention."""

  block = LocalAttention

  def check(self, m):
    check_chunked(m, "local", m.local_attn_chunk_length, m.local_num_chunks_before, m.local_num_chunks_after)

  def forward_flops(self, c, seq_len: int, layer: int) -> float:
    """Forward matmul FLOPs per token: the four projections, then scores and values over the keys of a chunk and
    its neighbours (the whole row when it fits in one chunk)."""
    inner = c.num_heads * c.head_dim
    keys = seq_len if seq_len <= c.local_attn_chunk_length else (
        c.local_attn_chunk_length * (1 + c.local_num_chunks_before + c.local_num_chunks_after))
    return 2 * 4 * c.hidden_size * inner + 2 * 2 * keys * inner
