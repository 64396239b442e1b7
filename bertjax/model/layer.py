"""One transformer layer, composed of the kinds its config names: the attention kind's block, the FFN block, and
the norm kind between them; and ALBERT's cross-layer sharing (blocks a group of layers shares come in as
parameters stacked per group).

Importing this module registers the built-in kinds (bertjax.model.mha, lsra, ffn, norms, positions, constituent,
complex_order, tree_attention, chunked, lsh, per_layer).
"""

import dataclasses

import jax
import jax.numpy as jnp
from flax import linen as nn

from bertjax.core import sharding as sh
from bertjax.model import ffn as ffn_lib
from bertjax.model import kinds, lsra, mha, norms, positions as position_kinds  # noqa: F401  (built-in kinds register on import)
from bertjax.model import complex_order, constituent, tree_attention  # noqa: F401  (ICLR-2020 variants: docs/models.md)
from bertjax.model import chunked, lsh, per_layer  # noqa: F401  (Reformer's attentions: docs/models.md)
from bertjax.model.hparams import EncoderConfig, layers_per_iteration, QUANT_RANGES, REMAT_POLICIES
from bertjax.model.layers import Block, rows_at

BLOCK_NAMES = ("attention", "ffn")  # a layer's blocks, in order; the names of their parameter scopes


def block_class(c: EncoderConfig, name: str):
  """The flax module of a layer's block `name`: the attention kind's block, or the FFN block."""
  return kinds.of(c, "attention").block if name == "attention" else ffn_lib.FeedForward


def layers_per_step(c: EncoderConfig) -> int:
  """Consecutive layers one step of the layer scan runs (the attention kind's answer: 1 unless its layers differ)."""
  return kinds.of(c, "attention").layers_per_step(c)


def scan_unit(c: EncoderConfig, layer):
  """The module one step of the layer scan runs, from the layer kind's module (the attention kind's answer)."""
  return kinds.of(c, "attention").scan_unit(c, layer)


def per_step(c: EncoderConfig, x):
  """A per-layer input x [L, ...] (layer indices, head gates) as the layer scan's steps take it: [L / P, P, ...]
  for P layers per step; x itself when P is 1 or x is None."""
  p = layers_per_step(c)
  return x if p == 1 or x is None else x.reshape((x.shape[0] // p, p) + x.shape[1:])


def is_stacked(path) -> bool:
  """Whether the parameter at a tree path (jax key path) stacks one tensor per layer or per ALBERT group
  on its leading axis: everything under a scanned `layers` scope or a shared block of the Encoder, unless the
  path ends in a sequence index (one layer's array of a split leaf: bertjax.model.unstacked.Layers)."""
  return (any(getattr(k, "key", None) in ("layers", *BLOCK_NAMES) for k in path)
          and not isinstance(path[-1], jax.tree_util.SequenceKey))


def shared_blocks(sharing: str) -> tuple[str, ...]:
  """Names of the blocks that the layers of a group share under a sharing mode."""
  return {"none": (), "all": ("attention", "ffn"), "attention": ("attention",), "ffn": ("ffn",)}[sharing]


class Layer(Block):
  """One transformer layer; blocks it does not own come in as `shared` parameters (ALBERT sharing). The scan's
  carry is (the norm kind's carry, the attention kind's state): post carries the stream, pre the stream and its
  norm; the state is None unless the attention kind carries one up the stack (`MHA.start`: the Tree
  Transformer's break probabilities), which the attention block then takes last and hands on."""

  @nn.compact
  def __call__(self, carry, layer_index, mask, shared, head_gates=None, positions=None, at=None):
    """`mask`: the attention kind's per-row input; `positions`: the position kind's tables for the encoder.
    `at`: optional [B, K] positions, the only ones this layer computes (its output is [B, K, E]; the encoder's
    last layer when only they are wanted)."""
    c = self.cfg
    norm = kinds.of(c, "norm")
    carry, state = carry
    x = norm.stream(carry)
    group = layer_index * c.num_groups // c.num_layers  # ALBERT: consecutive layers form a group
    for name in BLOCK_NAMES:
      if name == "attention":
        args = (norm.attention_input(carry), mask, head_gates, positions, layer_index, at)
        args += () if state is None else (state,)
      else:
        args = (x,)
      y = self._block(name, shared, group, args)
      if name == "attention" and state is not None:
        y, state = y
      x = norm.add_attention(x if at is None else rows_at(x, at), y) if name == "attention" else y
    constrain = lambda h: nn.with_logical_constraint(h, (sh.BATCH, sh.LENGTH, sh.ACT_EMBED))
    x = constrain(x)
    self.sow("intermediates", "hidden", x)  # kept only when asked for (distillation's layer losses)
    return (norm.finish(c, x, constrain), state), None

  def _block(self, name, shared, group, args):
    """Runs block `name`: this layer's own, or the group's shared parameters (passing on what it sows)."""
    block = block_class(self.cfg, name)
    if name not in shared:
      return block(self.cfg, self.deterministic, name=name)(*args)
    params = jax.tree.map(lambda p: p[group], shared[name])
    rngs = {} if self.deterministic else {"dropout": self.make_rng("dropout")}
    shared_block = block(self.cfg, self.deterministic, parent=None)
    if not self.is_mutable_collection("intermediates"):
      return shared_block.apply({"params": params}, *args, rngs=rngs)
    y, sown = shared_block.apply({"params": params}, *args, rngs=rngs, mutable="intermediates")
    for key, (value,) in sown.get("intermediates", {}).items():  # as the block's own would be sown
      self.sow("intermediates", key, value)
    return y


def sown_by_layers(intermediates, key: str):
  """The [layers, ...] stack of one value every layer sows (`hidden`, `attention_probs`), from the
  "intermediates" a model's apply returned with that collection mutable: one per encoder, the scanned layers
  stacking it along axis 0."""
  (value,) = [v for path, v in jax.tree_util.tree_leaves_with_path(intermediates["intermediates"]["encoder"])
              if any(getattr(k, "key", None) == key for k in path)]
  return value


def stacked_init(c: EncoderConfig, name: str, n: int):
  """Initializer of `n` stacked copies of block `name`'s parameters, with a leading `layers` axis name."""

  cfg = dataclasses.replace(c, attention="xla")  # the parameters do not depend on the implementation
  block = block_class(cfg, name)

  def init(rng):
    x = jnp.zeros((1, 1, cfg.hidden_size), cfg.dtype)
    one = lambda r: block(cfg, parent=None).init({"params": r}, *block.init_args(cfg, x))["params"]
    stacked = jax.vmap(one)(jax.random.split(rng, n))
    return jax.tree.map(lambda b: b.add_axis(0, {nn.PARTITION_NAME: sh.LAYERS}), stacked,
                        is_leaf=lambda b: isinstance(b, nn.Partitioned))

  return init


def remat(layer, c: EncoderConfig):
  """The layer module under the config's remat policy (as it is under `none`)."""
  if REMAT_POLICIES[c.remat] is None and c.remat != "full":
    return layer
  return nn.remat(layer, policy=REMAT_POLICIES[c.remat], prevent_cse=False)


def scan_layers(layer, c: EncoderConfig, length: int, broadcast: int = 0):
  """`length` layers under nn.scan (`layers_per_step` a step): params stacked, dropout split, `broadcast` shared."""
  return nn.scan(
      scan_unit(c, layer),
      variable_axes={"params": 0, "intermediates": 0, QUANT_RANGES: 0},
      split_rngs={"params": True, "dropout": True},
      in_axes=(0, nn.broadcast, nn.broadcast, 0, nn.broadcast) + (nn.broadcast,) * broadcast,
      length=length // layers_per_step(c),
      metadata_params={nn.PARTITION_NAME: sh.LAYERS},
      unroll=min(layers_per_iteration(c), length // layers_per_step(c)),
  )


def all_unrolled(c: EncoderConfig) -> bool:
  """Whether the layer kind's stack is `scan_layers` with every layer unrolled (the CPU's default): each layer then
  reads a static slice of the stacked parameters, which a state split per layer (bertjax.model.unstacked) saves."""
  return kinds.of(c, "layer").scanned and layers_per_iteration(c) >= c.num_layers // layers_per_step(c)
