"""The `lsh` attention kind: Reformer's LSH self-attention (Kitaev, Kaiser and Levskaya, ICLR 2020) as transformers
5.24 writes it (models/reformer/modeling_reformer.py, LSHSelfAttention), on the chunk helpers of
bertjax.model.chunked.

Queries and keys are one shared projection (`query_key`, no bias; `value` and `output` have none either). Each hash
round r rotates the (gradient-stopped) query-keys by a random matrix R [heads, head_dim, rounds, buckets / 2] and
takes the bucket argmax(cat[xR, -xR]); with `num_buckets` factorized (f1, f2, ...) every factor hashes its own slice
of R and the bucket is sum_i argmax_i * prod_{j<i} f_j. Padding tokens (group 0) go to an extra bucket after the
last one, which is always reserved: transformers adds it only when the batch holds padding, which gives the same
order. The positions of all rounds are sorted by (round, bucket), stably, so ties keep their positions' order
(transformers' `_stable_argsort`; here a sort of small integer keys: its scaled key n_h S bucket + index
overflows int32 on long rows), gathered, and cut into chunks of `lsh_attn_chunk_length`; each chunk attends to
itself and `lsh_num_chunks_before` / `_after` neighbours, circularly across the whole sorted row (so a round's
first chunk reads the previous round's last). Queries are the raw query-keys, keys are length-normalized,
x / sqrt(mean(x^2) + 1e-6) / sqrt(head_dim). A padding key, a key of another packed example and with
`model.causal` a later key get -1e9; a query's own position (in any round) -1e5, so a token with no other key
attends itself. The rounds' outputs, put back in position order, are summed with weights softmax over rounds of
their logsumexp. A row no longer than one chunk runs plain attention with the shared query-keys, the key norm and
both masks, and hashes nothing (as there).

The rotations: with `model.hash_seed` >= 0 one R = normal(key(hash_seed)) serves every layer and step
(transformers' hash_seed: one torch.manual_seed before every draw); otherwise each layer draws its own, from its
dropout key while training (new rotations every step, as transformers and trax draw them) and from key(0) folded
with the layer's index when dropout is off (a deterministic eval). Every layer sows its buckets
(`intermediates`/`buckets`: [B, heads, rounds, S], the extra bucket = prod(num_buckets) for padding), and takes
them from the `lsh_buckets` collection instead of hashing when a caller passes it in (`BUCKETS`).
"""

import math

import jax
import jax.numpy as jnp
from flax import linen as nn

from bertjax.core.config import check, ints_list
from bertjax.core.errors import UserError
from bertjax.model import kinds
from bertjax.model.chunked import (Chunked, allowed, attend, block_output, check_chunked, chunked, dropout_rate,
                                   heads_first, look_adjacent, probs_dropout, projection)
from bertjax.model.layers import Block

SELF_MASK = -1e5  # transformers' self_mask_value_float32
# A variable collection a caller may pass in to set a layer's buckets instead of hashing (a reversible stack's
# recompute, as transformers reuses the forward pass's buckets): {"buckets": [B, heads, rounds, S]} at the block.
BUCKETS = "lsh_buckets"


def bucket_factors(c, seq_len: int) -> tuple:
  """The buckets' factors: EncoderConfig.num_buckets, or transformers' `_set_num_buckets` rule for a row of
  `seq_len` (2^floor(log2(2 S / chunk)) buckets, split in two factors above 2 max(sqrt(max_positions / chunk),
  chunk))."""
  if c.num_buckets:
    return tuple(c.num_buckets)
  power = (2 * (seq_len // c.lsh_attn_chunk_length)).bit_length() - 1
  limit = 2 * max(int((c.max_positions // c.lsh_attn_chunk_length) ** 0.5), c.lsh_attn_chunk_length)
  return (2 ** (power // 2), 2 ** (power - power // 2)) if 2 ** power > limit else (2 ** power,)


def rotations_shape(c, seq_len: int) -> tuple:
  """The shape of R: [heads, head_dim, rounds, sum of the bucket factors / 2] (transformers' rotations_shape)."""
  return (c.num_heads, c.head_dim, c.num_hashes, sum(bucket_factors(c, seq_len)) // 2)


def seeded_rotations(c, seq_len: int):
  """The one R of every layer with model.hash_seed >= 0: normal(key(hash_seed)), float32. A parity test hands it
  to transformers (its torch.randn in place of its own draw: the two generators differ)."""
  return jax.random.normal(jax.random.key(c.hash_seed), rotations_shape(c, seq_len), jnp.float32)


def rotations(module, seq_len: int, layer_index):
  """R of this layer (see the module's docstring for where it comes from), float32."""
  c = module.cfg
  if c.hash_seed >= 0:
    return seeded_rotations(c, seq_len)
  if not module.deterministic:
    key = module.make_rng("dropout")
  else:
    key = jax.random.fold_in(jax.random.key(0), layer_index)
  return jax.random.normal(key, rotations_shape(c, seq_len), jnp.float32)


def hash_buckets(qk, r, groups, factors):
  """Buckets [B, heads, rounds, S] (int32) of the query-keys qk [B, heads, S, D] under rotations r; padding
  (groups == 0) in the extra bucket prod(factors)."""
  rotated = jnp.einsum("bhsd,hdnr->bhnsr", jax.lax.stop_gradient(qk).astype(jnp.float32), r,
                       precision=jax.lax.Precision.HIGHEST)
  buckets, start, scale = 0, 0, 1
  for f in factors:
    part = rotated[..., start:start + f // 2]
    buckets = buckets + scale * jnp.argmax(jnp.concatenate([part, -part], axis=-1), axis=-1).astype(jnp.int32)
    start, scale = start + f // 2, scale * f
  return jnp.where(groups[:, None, None, :] > 0, buckets, scale)


def sort_by_bucket(buckets, n_buckets: int):
  """(order, undo) [B, heads, rounds x S]: the stable sort of every round's positions by (round, bucket), as
  indices into the rounds' concatenated rows, and its inverse permutation. The sort key round x (n_buckets + 1) +
  bucket (the extra padding bucket included) stays below rounds x (n_buckets + 1): no int32 overflow at any length."""
  b, h, rounds, s = buckets.shape
  keys = (buckets + jnp.arange(rounds, dtype=jnp.int32)[:, None] * (n_buckets + 1)).reshape(b, h, rounds * s)
  order = jnp.argsort(keys, axis=-1, stable=True)
  return order, jnp.argsort(order, axis=-1, stable=True)


def length_norm(x, eps: float = 1e-6):
  """x / sqrt(mean(x^2) + eps) over the last axis (transformers' `_len_norm`)."""
  return x * jax.lax.rsqrt(jnp.mean(jnp.square(x), axis=-1, keepdims=True) + eps)


def lsh_attention(qk, v, groups, r, factors, length: int, before: int, after: int, causal: bool, drop,
                  buckets=None):
  """transformers' LSHSelfAttention after its projections: qk, v [B, heads, S, D], groups [B, S], rotations r ->
  (context [B, heads, S, D], buckets [B, heads, rounds, S] or None for a row of one chunk). `buckets`: given
  instead of hashed (transformers' cached buckets, which its reversible backward pass reuses)."""
  b, h, s, d = qk.shape
  scale = jnp.sqrt(jnp.float32(d))
  if s <= length:  # one chunk: plain attention, nothing hashed
    pos = jnp.arange(s)
    ok = allowed(groups[:, None, :, None], groups[:, None, None, :], pos[:, None], pos, causal)
    keys = (length_norm(qk.astype(jnp.float32)) / scale).astype(qk.dtype)
    return attend(qk, keys, v, ok, drop, pos[:, None] == pos, SELF_MASK)[0], None
  rounds = r.shape[2] if buckets is None else buckets.shape[2]
  if rounds * s % length:
    raise UserError(f"{rounds} hash rounds of a {s}-token row do not split into chunks of "
                    f"model.lsh_attn_chunk_length={length}; use a seq_len that is a multiple of it")
  buckets = hash_buckets(qk, r, groups, factors) if buckets is None else buckets
  order, undo = sort_by_bucket(buckets, math.prod(factors))
  pos = order % s  # [B, heads, rounds x S]: the original position of every sorted slot
  gather = lambda x: jnp.take_along_axis(x, pos[..., None], axis=2)
  sorted_qk, sorted_v = gather(qk), gather(v)
  sorted_keys = (length_norm(sorted_qk.astype(jnp.float32)) / scale).astype(qk.dtype)
  adjacent = lambda x: look_adjacent(chunked(x, 2, length), before, after, 2)
  q_pos, k_pos = chunked(pos, 2, length), adjacent(pos)  # [B, heads, n, c], [B, heads, n, W]
  g = jnp.broadcast_to(groups[:, None, :], (b, h, s))
  q_groups, k_groups = jnp.take_along_axis(g, q_pos.reshape(b, h, -1), 2), jnp.take_along_axis(g, pos, 2)
  ok = allowed(q_groups.reshape(q_pos.shape)[..., None], adjacent(k_groups)[..., None, :], q_pos[..., None],
               k_pos[..., None, :], causal)
  out, lse = attend(chunked(sorted_qk, 2, length), adjacent(sorted_keys), adjacent(sorted_v), ok, drop,
                    q_pos[..., None] == k_pos[..., None, :], SELF_MASK)
  out = jnp.take_along_axis(out.reshape(b, h, rounds * s, d), undo[..., None], axis=2).reshape(b, h, rounds, s, d)
  lse = jnp.take_along_axis(lse.reshape(b, h, rounds * s), undo, axis=2).reshape(b, h, rounds, s)
  weights = jnp.exp(lse - jax.nn.logsumexp(lse, axis=2, keepdims=True))  # 1 for a single round
  return jnp.sum(out * weights[..., None].astype(out.dtype), axis=2), buckets


class LSHAttention(Block):
  """Reformer's LSH self-attention: parameters `query_key`, `value` [H, heads, head_dim] and `output`
  [heads, head_dim, H], all without bias."""

  @nn.compact
  def __call__(self, x, mask, head_gates=None, positions=None, layer_index=0, at=None):
    """`x` [B, S, H]: the norm kind's attention input; `mask`: the rows' groups [B, S] (what `LSH.mask` makes);
    the other arguments are MultiHeadAttention's (`at` is not supported: the kind does not compute rows)."""
    assert at is None, "lsh attention computes every position (LSH.computes_rows is False)"
    c = self.cfg
    s = x.shape[1]
    qk, v = (heads_first(projection(c, name)(x)) for name in ("query_key", "value"))
    r = rotations(self, s, layer_index) if s > c.lsh_attn_chunk_length else None
    given = self.get_variable(BUCKETS, "buckets")  # None unless the caller passes that collection in
    ctx, buckets = lsh_attention(qk, v, mask, r, bucket_factors(c, s), c.lsh_attn_chunk_length,
                                 c.lsh_num_chunks_before, c.lsh_num_chunks_after, c.causal,
                                 probs_dropout(self, dropout_rate(c, c.lsh_attention_dropout)), given)
    if buckets is not None:
      self.sow("intermediates", "buckets", buckets)
    return block_output(self, x, ctx, head_gates)

  @staticmethod
  def init_args(c, x):
    """Arguments that initialize the block alone (ALBERT's shared blocks): one example."""
    return (x, jnp.ones(x.shape[:2], jnp.int32))


@kinds.register("attention", "lsh")
class LSH(Chunked):
  """Reformer's LSH self-attention."""

  block = LSHAttention

  def check(self, m):
    check_chunked(m, "lsh", m.lsh_attn_chunk_length, m.lsh_num_chunks_before, m.lsh_num_chunks_after)
    check(m.num_hashes >= 1, f"model.num_hashes={m.num_hashes} must be at least 1")
    factors = ints_list(m.num_buckets, "model.num_buckets")
    check(all(f >= 2 and f % 2 == 0 for f in factors), f"model.num_buckets={m.num_buckets!r}: every bucket count "
          "(or factor) must be even and at least 2, e.g. 64 or 8,16")

  def forward_flops(self, c, seq_len: int, layer: int) -> float:
    """Forward matmul FLOPs per token: the three projections (shared query-key, value, output), the hash's
    rotation, then scores and values over the keys of a chunk and its neighbours in every round (the whole row,
    once, when it fits in one chunk)."""
    inner = c.num_heads * c.head_dim
    if seq_len <= c.lsh_attn_chunk_length:
      return 2 * 3 * c.hidden_size * inner + 2 * 2 * seq_len * inner
    keys = c.lsh_attn_chunk_length * (1 + c.lsh_num_chunks_before + c.lsh_num_chunks_after)
    rotation = 2 * inner * c.num_hashes * (sum(bucket_factors(c, seq_len)) // 2)  # [head_dim] x [rounds x rot / 2]
    return 2 * 3 * c.hidden_size * inner + rotation + c.num_hashes * 2 * 2 * keys * inner
