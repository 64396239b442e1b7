"""What every family's fine-tuning model shares: initialization from pretrained weights, restoring a saved
model's params, where a seed's model is saved, and ELECTRA's layer-wise learning-rate decay. The heads
themselves live in each family's package (classification/model.py, squad/model.py, tagging/model.py,
multiple_choice/model.py)."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import linen as nn

from bertjax.core import sharding as sh
from bertjax.core.errors import UserError
from bertjax.model.hparams import EncoderConfig

MODEL_DIR = "model"  # a seed's fine-tuned model, under workdir/seed_S/ (finetune's save_model)


@functools.lru_cache(maxsize=4)
def _init_fn(model: nn.Module):
  ids = jnp.zeros((1, 8), jnp.int32)
  return jax.jit(lambda r: model.init({"params": r}, ids, ids, jnp.ones_like(ids))["params"])


def init_params(model: nn.Module, rng, pretrained: dict, pooler: dict | None,
                parts: tuple = ("embeddings", "encoder")) -> tuple[dict, list]:
  """(params, names of the freshly initialized parts): `parts` (embeddings and encoder; XLNet's transformer) from
  `pretrained` (a Pretrainer params tree), the pooler from `pooler` when given, the classifier always fresh."""
  fresh = _init_fn(model)(rng)
  params = dict(sh.strip_boxes(fresh))
  for name in parts:
    want = jax.tree.map(np.shape, params[name])
    have = jax.tree.map(np.shape, pretrained[name])
    if want != have:
      raise UserError(f"the checkpoint's {name} do not fit the model built from its config; is config.json "
                      "the checkpoint's own?")
    params[name] = jax.tree.map(jnp.asarray, pretrained[name])
  new = [name for name in params if name not in parts]
  fits = lambda a, b: jax.tree.structure(jax.tree.map(np.shape, a)) == jax.tree.structure(jax.tree.map(np.shape, b))
  if pooler is not None and "pooler" in params and fits(pooler, params["pooler"]):  # (a BERT pooler is no ModernBERT head)
    params["pooler"] = jax.tree.map(jnp.asarray, pooler)
    new.remove("pooler")
  return params, sorted(new)


def restore_params(directory: str, model: nn.Module) -> dict:
  """The params of a fine-tuned `model` (any head model applied as (input_ids, type_ids, groups)) from the
  checkpoint in `directory`: shapes from an abstract init, no host-side init of real weights."""
  from bertjax.train import checkpoint

  ids = jax.ShapeDtypeStruct((1, 8), jnp.int32)
  shapes = sh.strip_boxes(jax.eval_shape(lambda r, i: model.init({"params": r}, i, i, i)["params"],
                                         jax.random.key(0), ids))
  return jax.tree.map(jnp.asarray, checkpoint.restore_params(directory, shapes))


def layer_multipliers(params: dict, cfg: EncoderConfig, decay: float) -> dict:
  """Learning-rate multipliers (ELECTRA's layer-wise decay): decay^(L + 2 - depth) with depth 0 for the
  embeddings (and E->H projection), i + 1 for layer i, L + 1 for a pretrained-style pooler and L + 2 for
  the task-specific head (classifier, ELECTRA's transform): google-research/electra _get_layer_lrs.
  Stacked layers get one multiplier per layer along their leading axis; ALBERT's shared groups take
  their deepest layer's."""
  n = cfg.num_layers
  per_layer = decay ** (n + 1 - np.arange(n, dtype=np.float64))  # layer i at depth i + 1
  groups = np.arange(1, cfg.num_groups + 1) * n // cfg.num_groups  # deepest layer of each group, + 1
  per_group = decay ** (n + 2 - groups.astype(np.float64))

  def mult(path, leaf):
    keys = [getattr(k, "key", None) for k in path]
    top = keys[0]
    if top == "embeddings" or keys[:2] == ["encoder", "embedding_projection"]:
      return jnp.float32(decay ** (n + 2))
    if top == "pooler":
      return jnp.float32(decay)
    if top == "encoder":
      m = per_layer if keys[1] == "layers" else per_group
      return jnp.asarray(m.reshape((-1,) + (1,) * (np.ndim(leaf) - 1)), jnp.float32)
    return jnp.float32(1.0)

  return jax.tree_util.tree_map_with_path(mult, params)


def scale_by_tree(multipliers) -> optax.GradientTransformation:
  """Multiplies each update by its entry of `multipliers` (a tree of scalars or broadcastable arrays)."""

  def init(params):
    del params
    return optax.EmptyState()

  def update(updates, state, params=None):
    del params
    return jax.tree.map(lambda u, m: u * m.astype(u.dtype), updates, multipliers), state

  return optax.GradientTransformation(init, update)
