"""The `per_layer` attention kind: each layer's attention kind from a pattern, `model.attn_layers` ("local,lsh", or
a whole per-layer list as transformers' Reformer config.attn_layers), repeated over the stack.

The layer scan stacks parameters of one structure, and layers of different kinds have different ones (lsh:
query_key, value; local: query, key, value). So one step of the scan runs the pattern's period P (the smallest
period of the per-layer list: 4 for Reformer-enwik8's 12 layers, 2 for [local, lsh] x 3) as P consecutive layers,
each the layer kind's module with its own attention kind and parameters, and the scan runs L / P steps. Parameters
stack [L / P, ...] under `layers/<j>/` for slot j of a step: layer i is step i // P, slot i % P. No layer holds
another kind's parameters and nothing is computed twice, so parameter counts and FLOPs are the kinds' own; a list
without a shorter period runs every layer in one step (unrolled). Each layer keeps its index (its rotations, its
head gates, a per-layer option). A pattern of one kind runs with P = 1 (its parameters under `layers/0/`;
naming the kind as model.attention_kind gives the plain tree).

What the pattern leaves out: kinds that carry state up the stack (constituent), ALBERT's shared blocks (one kind's
parameters) and the fused implementations (model.attention=auto runs xla); a caller reading every layer's sown
values (`sown_by_layers`) finds one stack per slot.
"""

import dataclasses

from flax import linen as nn

from bertjax.core.config import check, names_list
from bertjax.model import kinds, mha
from bertjax.model.layers import Block

NAME = "per_layer"


def pattern(c) -> tuple:
  """Every layer's attention kind: EncoderConfig.attn_layers repeated to num_layers."""
  names = tuple(c.attn_layers)
  return names * (c.num_layers // len(names))


def period(c) -> int:
  """The smallest P dividing num_layers with layer i's kind that of layer i % P."""
  names = pattern(c)
  n = len(names)
  return next(p for p in range(1, n + 1) if n % p == 0 and names == names[:p] * (n // p))


def slot_config(c, name: str):
  """The EncoderConfig a layer of kind `name` runs with."""
  return dataclasses.replace(c, attention_kind=name)


class LayerGroup(Block):
  """One step of the layer scan: `period` consecutive layers, slot j the layer kind's module (`layer`, set by
  `PerLayer.scan_unit`) with the j-th kind of the pattern, its parameters under `<j>`."""

  layer = None  # the layer kind's module (a class attribute of the subclass scan_unit makes, not a field)

  @nn.compact
  def __call__(self, carry, index, mask, shared, head_gates=None, positions=None, at=None):
    """As the layer kind's module, with `index` [P] (the step's layer indices), `mask` {kind: its mask} and
    `head_gates` [P, heads] or None."""
    assert at is None, "a per-layer pattern computes every position (PerLayer.computes_rows is False)"
    c = self.cfg
    if period(c) == 1:  # the scan hands a step one layer's index and gates (bertjax.model.layer.per_step)
      index, head_gates = index[None], None if head_gates is None else head_gates[None]
    for j, name in enumerate(pattern(c)[:period(c)]):
      gates = None if head_gates is None else head_gates[j]
      carry, _ = self.layer(slot_config(c, name), self.deterministic, name=str(j))(
          carry, index[j], mask[name], shared, gates, positions)
    return carry, None


@kinds.register("attention", NAME)
class PerLayer(mha.AttentionKind):
  """Each layer's attention kind from model.attn_layers."""

  computes_rows = False  # the encoder's [CLS]-only last layer slices the stack per layer
  fused = False

  def family(self, m):
    """The transformers family of the pattern's kinds: theirs when they agree ("" when they differ: no export)."""
    families = {kinds.get("attention", name).family(m) for name in names_list(m.attn_layers)}
    return next(iter(families)) if len(families) == 1 else ""

  def check(self, m):
    names = names_list(m.attn_layers)
    check(names and m.num_layers % len(names) == 0, f"model.attention_kind={NAME} takes each layer's kind from "
          f"model.attn_layers={m.attn_layers!r}; give a comma-separated list whose length divides model.num_layers="
          f"{m.num_layers}, e.g. local,lsh")
    for name in dict.fromkeys(names):
      kind = kinds.get("attention", name)
      check(name != NAME and type(kind).start is mha.AttentionKind.start, f"model.attn_layers names {name}, which "
            f"a per-layer pattern cannot hold (a pattern, or a kind that carries state up the stack)")
      kind.check(m)
    check(m.sharing == "none", f"model.attention_kind={NAME}: ALBERT's shared blocks hold one kind's parameters; "
          "use --config.model.sharing=none")

  def layers_per_step(self, c) -> int:
    return period(c)

  def layer_kind(self, c, index, mask):
    name = pattern(c)[index]
    return slot_config(c, name), mask[name]

  def scan_unit(self, c, layer):
    return type("LayerGroup", (LayerGroup,), {"layer": layer})

  def mask(self, c, groups):
    """{kind: its mask} for every kind of the pattern."""
    return {name: kinds.get("attention", name).mask(slot_config(c, name), groups) for name in set(c.attn_layers)}

  def forward_flops(self, c, seq_len: int, layer: int) -> float:
    """Layer `layer`'s kind's count."""
    name = pattern(c)[layer]
    return kinds.get("attention", name).forward_flops(slot_config(c, name), seq_len, layer)
