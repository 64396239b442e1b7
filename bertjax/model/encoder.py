"""The encoder: the E->H projection (if factorized) and `num_layers` transformer layers scanned over depth.

One encoder serves BERT, RoBERTa, ALBERT, ELECTRA and ModernBERT-class models: what differs between them is
the kinds its config names (bertjax.model.kinds: attention, position, norm and feed-forward kinds, each a module
that registers itself), which the layers compose; this module never asks which kind it runs. Every parameter
carries logical axis names (bertjax.core.sharding), so sharding is a config choice. Layers run under `nn.scan`
(stacked parameters, compile time flat in depth; the CPU unrolls it, bertjax.model.config.scan_unroll).
ALBERT's cross-layer sharing keeps a shared block once per group *outside* the scan and hands it to every
scanned layer, so all sharing modes are the same scanned layer with a different set of blocks it owns. A caller
that keeps only a few positions (a [CLS] classifier) passes them as `outputs_at`: the last layer then computes
only those queries (Encoder.split_stack), where the attention kind can.
"""

import jax
import jax.numpy as jnp
from flax import linen as nn

from bertjax.core import sharding as sh
from bertjax.model import kinds, layer_kinds  # noqa: F401  (layer_kinds: the built-in kinds register)
from bertjax.model.hparams import QUANT_RANGES
from bertjax.model.layer import per_step, remat, scan_layers, shared_blocks, stacked_init  # noqa: F401  (remat: callers' import)
from bertjax.model.layers import Block, dense, rows_at


class Encoder(Block):
  """E->H projection (if factorized) and `num_layers` scanned transformer layers."""

  @nn.compact
  def __call__(self, x, groups, head_gates=None, position_ids=None, outputs_at=None):
    """head_gates: optional [layers, heads] multipliers of each head's output (1 = on, 0 = removed).
    position_ids: [B, S] positions (packed rows restart them per example), for position kinds that read them
    in the layers (rope); default 0..S-1.
    outputs_at: optional [B, K] positions (a classifier's [CLS]): the encoder returns only their hidden states
    [B, K, E], and its last layer computes only them (`last_layer_at`)."""
    c = self.cfg
    carry, mask, shared, positions = self.start(x, groups, position_ids)
    layer = remat(kinds.of(c, "layer").module, c)  # the layer kind's flax module (bert: bertjax.model.layer.Layer)
    if outputs_at is not None and self.last_layer_at():
      out = self.split_stack(layer, carry, mask, shared, head_gates, positions, outputs_at)
    else:  # the layer kind's stack (bert: `layer` under nn.scan; reformer: bertjax.model.reversible)
      out, _ = kinds.of(c, "layer").stack(c, layer)(c, self.deterministic, name="layers")(
          carry, per_step(c, jnp.arange(c.num_layers)), mask, shared, per_step(c, head_gates), positions)
      if outputs_at is not None:
        out = jax.tree.map(lambda h: rows_at(h, outputs_at), out[0]), None
    return kinds.of(c, "norm").output(out[0])

  def start(self, x, groups, position_ids=None):
    """What the layers start from, in the encoder's scope: the scan's first carry (the norm kind's, after the E->H
    projection if factorized), the attention kind's mask, the shared blocks' parameters (ALBERT) and the position
    kind's tables. A caller that runs the layers its own way (early exit's per-layer outputs) starts here too."""
    c = self.cfg
    if c.projects_in_encoder:
      x = dense(c, c.embedding_size, c.hidden_size, (None, sh.EMBED), "embedding_projection")(x)
    shared = {name: self.param(name, stacked_init(c, name, c.num_groups)) for name in shared_blocks(c.sharing)}
    positions = kinds.of(c, "position").layer_tables(c, position_ids, x.shape[:2])
    attention = kinds.of(c, "attention")
    carry = (kinds.of(c, "norm").start(x), attention.start(c, x))  # the norm kind's, and the attention kind's state
    return carry, attention.mask(c, groups), shared, positions

  def last_layer_at(self) -> bool:
    """Whether the last layer can compute only the wanted positions: with the xla attention of a kind that can,
    when no pass needs every layer's full output (init, sown intermediates, quantizers' ranges or intercepted
    matmuls)."""
    c = self.cfg
    return (kinds.of(c, "attention").computes_rows and kinds.of(c, "layer").scanned and c.attention == "xla"
            and not c.quantizable
            and not self.is_initializing() and not self.is_mutable_collection("intermediates")
            and QUANT_RANGES not in self.variables)

  def split_stack(self, layer, carry, mask, shared, head_gates, positions, at):
    """The layer stack as the first L - 1 layers scanned over their slices of the stacked parameters, then
    the last layer at positions `at` only: its queries, attention rows, output projection and FFN for K
    positions instead of S (a [CLS] classifier: about (1 - 2/12) of a layer's matmuls saved). Exact: the last
    layer's other positions reach nothing the caller keeps. Dropout draws its own masks here (the same
    distribution as the full stack's, other values)."""
    c, n = self.cfg, self.cfg.num_layers
    stacked = sh.strip_boxes(self.variables["params"].get("layers", {}))  # none when ALBERT shares every block
    rngs = lambda: {} if self.deterministic else {"dropout": self.make_rng("dropout")}
    gates = (None, None) if head_gates is None else (head_gates[:n - 1], head_gates[n - 1])
    if n > 1:
      first = jax.tree.map(lambda p: p[:n - 1], stacked)
      carry, _ = scan_layers(layer, c, n - 1)(c, self.deterministic, parent=None).apply(
          {"params": first}, carry, jnp.arange(n - 1), mask, shared, gates[0], positions, rngs=rngs())
    last = jax.tree.map(lambda p: p[n - 1], stacked)
    out, _ = layer(c, self.deterministic, parent=None).apply(
        {"params": last}, carry, jnp.int32(n - 1), mask, shared, gates[1], positions, at, rngs=rngs())
    return out
