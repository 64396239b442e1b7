"""Stacked parameters as their layers' arrays: the layout a training loop keeps where every layer runs unrolled.

The layer scan stacks each parameter of its layers on a leading [layers] axis (`layer.is_stacked`: the scanned
`layers` scope and ALBERT's shared blocks). Where every layer runs unrolled (the CPU's default,
`layer.all_unrolled`), the step reads static slice i of each stacked array for layer i and concatenates the
layers' gradients back into [layers, ...]: a copy of every layer parameter and of its gradient each step
(5-9% of a BERT-base CPU step, by a profile). A state whose stacked leaves are kept as `Layers` (one
array per layer, `split`) avoids them: the step stacks them (`join`) right before the model, and XLA folds
slice(concatenate(parts)) to part i, in the forward pass and in its transpose. The optimizer's state mirrors
the split tree (optax works per leaf; a part is one original tensor, so LAMB's and StableAdamW's per-tensor
quantities are the same ones). Checkpoints and everything else outside the step keep the stacked tree (`join`),
except repeated forward passes (inference, the fine-tuning predictor), which take a split copy (`for_calls`).
"""

import jax
import jax.numpy as jnp
from jax.tree_util import SequenceKey

from bertjax.model.layer import all_unrolled, is_stacked


class Layers(tuple):
  """One stacked leaf (a parameter, its gradient or an optimizer moment) as its slices along the leading axis.
  Its children's key paths end in a SequenceKey, which `layer.is_stacked` reads as one layer's array."""


jax.tree_util.register_pytree_with_keys(
    Layers, lambda t: (tuple((SequenceKey(i), x) for i, x in enumerate(t)), None), lambda _, xs: Layers(xs),
    flatten_func=lambda t: (tuple(t), None))


def is_layers(x) -> bool:
  return isinstance(x, Layers)


def split(tree, part=lambda x, i: x[i]):
  """`tree` (parameters, or a tree that holds them by path: an optimizer state) with every stacked leaf as
  `Layers` of its `part(x, i)` for i along its leading axis (default: the slices themselves)."""
  return jax.tree_util.tree_map_with_path(
      lambda path, x: Layers(part(x, i) for i in range(x.shape[0])) if is_stacked(path) else x, tree)


def join(tree):
  """`tree` with every `Layers` stacked back into one [layers, ...] array: the stacked tree; `tree` itself when
  it holds none."""
  return jax.tree.map(lambda x: jnp.stack(x) if is_layers(x) else x, tree, is_leaf=is_layers)


def for_calls(tree, cfg):
  """`tree` (variables, or parameters) for many forward passes of a model with encoder config `cfg`: split per
  layer where its layers all run unrolled (the CPU's default), once, so that no call slices (copies) every layer's
  weights out of the stacked arrays (a MiniLM forward on 32 x 32 tokens spent about a fifth of its thread time
  on those copies); the jitted call `join`s them, which XLA folds away. `tree` itself elsewhere (cfg None: a
  model without one)."""
  return split(tree) if cfg is not None and all_unrolled(cfg) else tree


def is_split(tree) -> bool:
  """Whether `tree` holds a split leaf."""
  return any(is_layers(x) for x in jax.tree.leaves(tree, is_leaf=is_layers))


def layer_of(path) -> int | None:
  """The layer a key path's leaf belongs to when it is one part of a split leaf; None otherwise."""
  return path[-1].idx if path and isinstance(path[-1], SequenceKey) else None
