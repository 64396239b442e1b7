"""Transformer-XL / XLNet relative attention as pure functions: the sinusoid relative positional encoding
(clamp_len, bi_data), `rel_shift`, the relative segment matrix and the two streams' masks over
[compressed memory; memory; input] keys.

Everything follows transformers' `modeling_xlnet.py` (XLNetModel.relative_positional_encoding, create_mask,
XLNetRelativeAttention.rel_shift_bnij and the mask code of XLNetModel.forward), with one change for `jit`:
memory is a fixed number of slots with a validity mask, valid rows right-aligned next to the input. The key
axis is then always `mem_slots + qlen` long, and `rel_shift` gives slot j the distance `mem_slots + i - j`,
which for a valid slot equals transformers' `mlen + i - j` over its growing memory. Invalid slots get a
penalty of 2e30 (masked keys get 1e30, as transformers subtracts), so a query that every real key masks
still spreads its probability uniformly over the real keys only, as transformers' row does.
"""

import jax.numpy as jnp

NEG = 1e30  # transformers' mask penalty (score - 1e30 * mask), float32


def inv_freq(d_model: int):
  """1 / 10000^(2k / d): the frequencies of the sinusoid (d_model / 2 of them)."""
  return 1.0 / (10000.0 ** (jnp.arange(0, d_model, 2, dtype=jnp.float32) / d_model))


def sinusoid(pos, d_model: int):
  """[len] positions -> [len, d_model]: sin of every frequency, then cos (halves concatenated, not interleaved)."""
  x = pos[:, None] * inv_freq(d_model)[None, :]
  return jnp.concatenate([jnp.sin(x), jnp.cos(x)], axis=-1)


def relative_positions(qlen: int, klen: int, attn_type: str = "bi", clamp_len: int = -1):
  """The relative distances the encoding holds, largest first: klen .. -qlen+1 (bi, klen + qlen of them) or
  klen .. 0 (uni), clamped to [-clamp_len, clamp_len] when clamp_len > 0."""
  end = -qlen if attn_type == "bi" else -1
  pos = jnp.arange(klen, end, -1, dtype=jnp.float32)
  return jnp.clip(pos, -clamp_len, clamp_len) if clamp_len > 0 else pos


def positional_encoding(qlen: int, klen: int, d_model: int, batch: int, attn_type: str = "bi",
                        clamp_len: int = -1, bi_data: bool = False):
  """[1, R, d_model] (or [batch, R, d_model] with bi_data: the first batch // 2 rows forward distances, the rest
  negated, as the reference's bidirectional data pipeline feeds reversed streams there; a run's batch per
  device is even, transformers requires it)."""
  pos = relative_positions(qlen, klen, attn_type, clamp_len)
  fwd = sinusoid(pos, d_model)[None]
  if not bi_data:
    return fwd
  bwd = sinusoid(-pos, d_model)[None]  # clamping is symmetric, so -clamp(p) == clamp(-p)
  half = batch // 2
  return jnp.concatenate([jnp.broadcast_to(fwd, (half,) + fwd.shape[1:]),
                          jnp.broadcast_to(bwd, (batch - half,) + bwd.shape[1:])], axis=0)


def rel_shift(x, klen: int):
  """transformers' rel_shift_bnij: x [B, N, Q, R] scored against the R distances of `relative_positions`
  -> [B, N, Q, klen] where column j holds distance (klen - Q) + i - j (bi). Reshape, drop a row, reshape."""
  b, n, q, r = x.shape
  x = x.reshape(b, n, r, q)[:, :, 1:, :]
  return x.reshape(b, n, q, r - 1)[:, :, :, :klen]


def rel_gather(x, at, klen: int, qlen: int):
  """`rel_shift` for queries standing at positions at [B, Q] of a qlen-long input: x [B, N, Q, R] -> [B, N, Q, klen],
  column j read at index qlen - at + j, the distance rel_shift gives that pair (uni's masked region past the
  diagonal, beyond the R distances, is clipped)."""
  idx = qlen - at[:, None, :, None] + jnp.arange(klen)[None, None, None, :]
  idx = jnp.broadcast_to(idx, x.shape[:3] + (klen,))
  return jnp.take_along_axis(x, idx, axis=3, mode="clip")


def segment_matrix(type_ids, mem_slots: int):
  """[B, S, mem_slots + S] bool: True where query i and key j are in different segments. Memory slots count
  as segment 0 (transformers' mem_pad)."""
  keys = jnp.concatenate([jnp.zeros((type_ids.shape[0], mem_slots), type_ids.dtype), type_ids], axis=1)
  return type_ids[:, :, None] != keys[:, None, :]


def stream_penalties(qlen: int, key_valid, attention_mask=None, perm_mask=None, attn_type: str = "bi"):
  """The additive penalties [B, S, K] (K = memory slots + S; subtract them from the scores) of the content
  stream and of the query stream.

  key_valid: [B, mem_slots] whether each memory slot holds a row. attention_mask: [B, S], 1 for real tokens,
  0 for padding (masks padded keys). perm_mask: [B, S, S], 1 where query i may not see key j (the
  factorization order). attn_type "uni" adds the causal mask (key j > mem_slots + i). The query stream gets the
  mask as it is; the content stream also always sees its own position (transformers' non_tgt_mask)."""
  b, m = key_valid.shape
  data = jnp.zeros((b, qlen, qlen), jnp.float32)
  if attention_mask is not None:
    data = data + (1.0 - attention_mask.astype(jnp.float32))[:, None, :]
  if perm_mask is not None:
    data = data + perm_mask.astype(jnp.float32)
  masked = jnp.concatenate([jnp.zeros((b, qlen, m), jnp.float32), data], axis=2) > 0
  if attn_type == "uni":
    i, j = jnp.arange(qlen)[:, None], jnp.arange(m + qlen)[None, :]
    masked = masked | (j > m + i)[None]
  own = jnp.concatenate([jnp.zeros((qlen, m), bool), jnp.eye(qlen, dtype=bool)], axis=1)
  invalid = jnp.concatenate([~key_valid.astype(bool), jnp.zeros((b, qlen), bool)], axis=1)[:, None, :]
  penalty = lambda mask: NEG * mask.astype(jnp.float32) + 2 * NEG * invalid.astype(jnp.float32)
  return penalty(masked & ~own[None]), penalty(masked)
