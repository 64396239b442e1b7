"""Rotary position embeddings (RoPE, Su et al. 2021) as ModernBERT applies them, with one base per layer kind.

The angles come from each token's `position_ids`, so packed rows, whose positions restart at every example,
rotate each example from 0 as if it were alone. As transformers' ModernBertRotaryEmbedding and
apply_rotary_pos_emb compute it: inv_freq = 1 / theta^(2i / d), angles = position x inv_freq in float32, and
q' = q cos + rotate_half(q) sin over the two halves of the head (not interleaved pairs), in float32.
"""

import jax.numpy as jnp


def _angles(position_ids, theta: float, head_dim: int):
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  return position_ids.astype(jnp.float32)[..., None] * inv_freq  # [B, S, head_dim / 2]


def tables(cfg, position_ids) -> dict:
  """{"global": (cos, sin), "local": (cos, sin)}, each [B, S, head_dim / 2], computed once per forward pass
  and shared by every layer (only the kinds the layers use)."""
  out, kinds = {}, {}
  if not cfg.local_layers or not all(cfg.local_layers):
    kinds["global"] = cfg.rope_theta
  if any(cfg.local_layers):
    kinds["local"] = cfg.local_rope_theta
  for kind, theta in kinds.items():
    a = _angles(position_ids, theta, cfg.head_dim)
    out[kind] = (jnp.cos(a), jnp.sin(a))
  return out


def select(rope: dict, local):
  """This layer's (cos, sin): the local or the global tables (`local` a bool, or traced in the layer scan)."""
  if "local" not in rope or local is False:
    return rope["global"]
  if "global" not in rope or local is True:
    return rope["local"]
  return tuple(jnp.where(local, l, g) for l, g in zip(rope["local"], rope["global"]))


def apply(x, rope):
  """x [B, S, heads, head_dim] rotated by (cos, sin) [B, S, head_dim / 2], in float32, back in x's dtype."""
  cos, sin = (t[:, :, None, :] for t in rope)
  x32 = x.astype(jnp.float32)
  half = x.shape[-1] // 2
  x1, x2 = x32[..., :half], x32[..., half:]
  return jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1).astype(x.dtype)
