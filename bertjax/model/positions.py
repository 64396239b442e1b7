"""Position kinds (`model.position`): how token order enters the encoder.

- `learned`: BERT's absolute table [max_positions, E], added to the word embeddings (RoBERTa's ids start at
  `position_offset`; packed rows restart them per example through `position_ids`).
- `rope`: no table; every attention layer rotates its queries and keys by the token's position
  (bertjax.model.rope, ModernBERT's global and local bases).

A position kind answers three questions: the embedding table it owns (`table`, created in Embeddings' setup),
what it adds to the embeddings (`embed`, through `add`), and what the attention layers need (`layer_tables` once per forward
pass, `for_layer` per layer, `rotate` inside attention).
"""

import jax.numpy as jnp

from bertjax.core import sharding as sh
from bertjax.core.config import check
from bertjax.model import kinds, rope as rope_lib
from bertjax.model.layers import kernel_init, rows_at


class PositionKind(kinds.Kind):
  """The interface; its defaults are a kind that adds nothing and rotates nothing."""

  def table(self, module, c):
    """The position table as a parameter of `module` (Embeddings, inside its setup), or None."""
    return None

  def embed(self, c, table, seq_len: int, position_ids):
    """What the embeddings add for positions ([1 or B, S, E], or 0)."""
    return 0

  def add(self, c, table, x, input_ids, position_ids):
    """The word embeddings `x` [B, S, E] of `input_ids` with positions entered: plus `embed` (every built-in
    kind); a kind that enters them otherwise (bertjax.model.complex_order multiplies) overrides it."""
    return x + self.embed(c, table, x.shape[1], position_ids)

  def layer_tables(self, c, position_ids, shape):
    """Per forward pass, what every attention layer reads (None: nothing); `shape` is the input's [B, S]."""
    return None

  def for_layer(self, tables, local):
    """This layer's part of `layer_tables` (`local`: whether it is a sliding-window layer, maybe traced)."""
    return tables

  def rotate(self, q, k, tables, at=None):
    """Queries [B, K, H, D] and keys [B, S, H, D] with positions applied (`at`: the queries' positions)."""
    return q, k

  def forward_flops(self, c) -> float:
    """Matmul FLOPs per token it adds (none for both built-in kinds)."""
    return 0.0


@kinds.register("position", "learned")
class Learned(PositionKind):
  """BERT's learned absolute positions."""

  def table(self, module, c):
    return module.param("position", kernel_init(c, (None, sh.EMBED)), (c.max_positions, c.embedding_size))

  def embed(self, c, table, seq_len, position_ids):
    if position_ids is None:
      return table[None, c.position_offset: c.position_offset + seq_len]
    return jnp.take(table, position_ids + c.position_offset, axis=0)


@kinds.register("position", "rope")
class Rotary(PositionKind):
  """Rotary positions (Su et al. 2021) with ModernBERT's base per layer kind (global, local)."""

  hf_family = "modernbert"

  def check(self, m):
    check((m.head_size or m.hidden_size // m.num_heads) % 2 == 0,
          "model.position=rope rotates pairs of a head's dimensions; use an even head width")
    check(m.rope_theta > 0 and m.local_rope_theta > 0,
          f"model.rope_theta={m.rope_theta} and model.local_rope_theta={m.local_rope_theta} must be positive")

  def layer_tables(self, c, position_ids, shape):
    if position_ids is None:
      position_ids = jnp.broadcast_to(jnp.arange(shape[1]), shape)
    return rope_lib.tables(c, position_ids)

  def for_layer(self, tables, local):
    return rope_lib.select(tables, local)

  def rotate(self, q, k, tables, at=None):
    return rope_lib.apply(q, tables if at is None else tuple(rows_at(t, at) for t in tables)), rope_lib.apply(k, tables)
