"""Device mesh, logical axis names and the rules that map them onto the mesh (presets dp, fsdp, fsdp_tp).

The model only ever names *logical* axes (below); which mesh axis, if any, each one is split over is data:
a preset's rule list, chosen by `--config.sharding`. Parameter axes and activation axes are kept apart so
that, e.g., FSDP can shard the `embed` dimension of weights while activations stay batch-sharded.
"""

import contextlib
import math

import jax
import numpy as np
from flax import linen as nn
from jax.sharding import NamedSharding, PartitionSpec as P

from bertjax.core.errors import UserError

# Parameter axes.
LAYERS = "layers"  # the stacked (scanned) layer dimension
VOCAB = "vocab"
EMBED = "embed"  # hidden (and embedding) width
MLP = "mlp"  # FFN inner width
HEADS = "heads"
KV = "kv"  # per-head width
# Activation axes.
BATCH = "activation_batch"
LENGTH = "activation_length"
ACT_EMBED = "activation_embed"

MESH_AXES = ("data", "fsdp", "tensor")

# Priority-ordered (logical axis -> mesh axes) pairs per preset. A logical axis missing from a list is
# replicated. `mesh` gives the preset's default mesh shape; -1 takes the remaining devices.
PRESETS = {
    # Pure data parallelism: weights replicated, batch split over every device.
    "dp": dict(mesh=dict(data=-1, fsdp=1, tensor=1), rules=((BATCH, ("data", "fsdp")),)),
    # ZeRO-3 style: weights (and optimizer state) split along `embed` over the fsdp axis; XLA gathers
    # each layer's weights just before use, so memory per device falls with the device count.
    "fsdp": dict(
        mesh=dict(data=1, fsdp=-1, tensor=1),
        rules=((BATCH, ("data", "fsdp")), (EMBED, "fsdp"), (VOCAB, None)),
    ),
    # FSDP over one mesh axis, Megatron-style tensor parallelism over another: heads and the FFN width
    # split over `tensor`, so each attention/FFN block needs one all-reduce instead of gathering weights.
    "fsdp_tp": dict(
        mesh=dict(data=1, fsdp=-1, tensor=2),
        rules=(
            (BATCH, ("data", "fsdp")),
            (EMBED, "fsdp"),
            (MLP, "tensor"),
            (HEADS, "tensor"),
            (VOCAB, "tensor"),
        ),
    ),
}


LOGICAL_AXES = (LAYERS, VOCAB, EMBED, MLP, HEADS, KV, BATCH, LENGTH, ACT_EMBED)


def rules_for(preset: str, explicit: str = ""):
  """The logical axis rules, as `nn.logical_axis_rules` takes them: the preset's, or `explicit` ones
  (`--config.sharding_rules`, "logical=mesh[+mesh],...": "embed=fsdp,activation_batch=data+fsdp";
  "vocab=" replicates) in their place, as MaxText's and t5x's configs allow."""
  if preset not in PRESETS:
    raise UserError(f"unknown sharding preset {preset!r}; use one of {', '.join(PRESETS)} (--config.sharding=...)")
  if not explicit:
    return PRESETS[preset]["rules"]
  rules = []
  for item in explicit.split(","):
    logical, eq, axes = (part.strip() for part in item.partition("="))
    names = tuple(a for a in axes.split("+") if a)
    bad = [a for a in names if a not in MESH_AXES]
    if not eq or logical not in LOGICAL_AXES or bad:
      raise UserError(f"sharding rule {item.strip()!r} is not LOGICAL=MESH[+MESH] with LOGICAL one of "
                      f"{', '.join(LOGICAL_AXES)} and MESH one of {', '.join(MESH_AXES)}; fix --config.sharding_rules")
    rules.append((logical, names[0] if len(names) == 1 else (names or None)))
  return tuple(rules)


def config_rules(config):
  """The run's rules: --config.sharding's preset, or --config.sharding_rules in their place."""
  return rules_for(config.sharding, config.sharding_rules)


@contextlib.contextmanager
def activate(mesh, rules):
  """The mesh and logical axis rules in force: what tracing, lowering and compiling a step under
  logical sharding constraints needs (the one place both are set)."""
  with nn.logical_axis_rules(rules), jax.set_mesh(mesh):
    yield


def mesh_shape(preset: str, num_devices: int, overrides=None) -> dict:
  """Mesh axis sizes for `preset` on `num_devices` devices; `overrides` (axis -> size) wins over the preset."""
  shape = dict(PRESETS[preset]["mesh"]) if preset in PRESETS else {}
  rules_for(preset)  # validates the name
  shape.update({k: v for k, v in (overrides or {}).items() if v})
  fixed = math.prod(v for v in shape.values() if v != -1)
  if num_devices % fixed:
    raise UserError(f"mesh {shape} does not divide {num_devices} devices; set --config.mesh.* to sizes whose product divides it")
  for k, v in shape.items():
    if v == -1:
      shape[k] = num_devices // fixed
      fixed = num_devices
  if math.prod(shape.values()) != num_devices:
    raise UserError(f"mesh {shape} uses {math.prod(shape.values())} of {num_devices} devices; make the sizes multiply to {num_devices}")
  return shape


def make_mesh(preset: str, devices=None, overrides=None) -> jax.sharding.Mesh:
  """A (data, fsdp, tensor) mesh over `devices` (default: all), laid out for the physical topology."""
  devices = jax.devices() if devices is None else devices
  shape = mesh_shape(preset, len(devices), overrides)
  dims = tuple(shape[a] for a in MESH_AXES)
  try:
    from jax.experimental import mesh_utils

    grid = mesh_utils.create_device_mesh(dims, devices=devices)
  except Exception:  # CPU and odd topologies: a plain reshape is as good as any layout.
    grid = np.asarray(devices).reshape(dims)
  return jax.sharding.Mesh(grid, MESH_AXES)


def batch_spec() -> P:
  """PartitionSpec of a [batch, ...] input array: batch split over data and fsdp."""
  return P(("data", "fsdp"))


def logical_shardings(tree, mesh, rules):
  """NamedShardings for a tree of (possibly boxed) values, from their logical axis names.

  A dimension that its mesh axes do not divide (e.g. an ELECTRA generator's single head under
  tensor=2) is replicated instead of failing: the rule is a preference, the shape decides."""
  shardings = nn.logical_to_mesh_sharding(nn.get_partition_spec(tree), mesh, rules)

  def fit(value, sharding):
    if not isinstance(sharding, NamedSharding) or not hasattr(value, "shape"):
      return sharding
    spec = list(sharding.spec) + [None] * (len(value.shape) - len(sharding.spec))
    fitted = []
    for dim, axes in zip(value.shape, spec):
      names = () if axes is None else (axes if isinstance(axes, tuple) else (axes,))
      size = math.prod(mesh.shape[a] for a in names)
      fitted.append(axes if names and dim % size == 0 else None)
    return NamedSharding(mesh, P(*fitted))

  return jax.tree.map(fit, strip_boxes(tree), shardings)


def replicated(mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def strip_boxes(tree):
  """The tree with logical-axis boxes replaced by their values, without sharding constraints (for
  abstract values outside jit, where `nn.unbox` would try to apply them)."""
  return jax.tree.map(lambda b: b.value if isinstance(b, nn.meta.AxisMetadata) else b, tree,
                      is_leaf=lambda b: isinstance(b, nn.meta.AxisMetadata))
