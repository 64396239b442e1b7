"""The one factory from a config to what runs: the model, its shapes, a fresh state, the jitted steps.

The training loop, the CLIs (summary, aot, bench), interop and inference all build through here, so a
model is made one way everywhere. `make_steps` places everything by logical axis names on a mesh and
jits init/train/eval with explicit shardings; each jitted function is traced, lowered and compiled
under the mesh and rules it was made for (`Jitted`).
"""

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from bertjax import objectives as objectives_lib
from bertjax.core import config as config_lib, sharding
from bertjax.core.errors import UserError
from bertjax.data import instances, prepare_lib
from bertjax.data.tokenizer import SpecialIds
from bertjax.model import config as model_config, kinds, layer as layer_lib, unstacked
from bertjax.model.pretrain import Pretrainer
from bertjax.data import plm as plm_data
from bertjax.objectives import masking, plm, wklm
from bertjax.train import optim, step as step_lib


def validate(config):
  """Checks the whole run config, each part by the code that owns its values (model, masking, objectives,
  optimizer, the run's own keys and phases, attention at every phase's shape, data); raises UserError with
  the fix on the first problem. Every command that runs a config checks it here first."""
  model_config.validate(config)
  masking.validate(config)
  objectives_lib.validate(config)
  optim.validate(config)
  config_lib.validate(config)
  model_config.validate_attention(config)
  instances.validate(config)
  _plugin(config)  # a config that needs a plugin (a teacher) fails here, before a run writes anything


@dataclasses.dataclass(frozen=True)
class Plugin:
  """A kind of run that plugs into the factory from above (distillation: bertjax.compress.distill), for the
  configs `applies` says: it wraps the model, the optimizer and the state initializer this module makes.
  The factory itself knows models and objectives only."""

  applies: Callable  # config -> bool
  model: Callable  # (config, model, platform) -> the model the steps run
  tx: Callable  # (config, tx) -> the optimizer the steps update with
  init: Callable  # (init, config, param_shardings) -> rng -> TrainState


_PLUGINS: list = []


def register(plugin: Plugin):
  """Adds `plugin` (once) to the kinds of run the factory builds."""
  if plugin not in _PLUGINS:
    _PLUGINS.append(plugin)


def _plugin(config) -> Plugin | None:
  """The plugin for this config, or None; a config with a teacher and no plugin loaded is an error (the
  distillation command loads it)."""
  found = next((p for p in _PLUGINS if p.applies(config)), None)
  if found is None and config.get("teacher"):
    raise UserError("--config.teacher is set: distillation runs with python -m bertjax.distill (or import "
                    "bertjax.compress.distill first)")
  return found


def make_model(config, platform: str | None = None) -> Pretrainer:
  """The pretraining model of a config (heads and generator follow from the objectives) for `platform`'s
  attention implementation (default: JAX's backend), as a plugin (distillation) wraps it for its configs."""
  objectives = config_lib.active_objectives(config)
  sentence = [o for o in objectives_lib.SENTENCE_OBJECTIVES if o in objectives]
  cfg = model_config.encoder_config(config.model, platform=platform)
  model = kinds.of(config.model, "layer").pretrainer(config, cfg)  # a kind with a model of its own (XLNet)
  if model is None:
    model = Pretrainer(
        cfg=cfg,
        generator=model_config.encoder_config(config.model, generator=True, platform=platform) if "rtd" in objectives else None,
        sentence_head=bool(sentence),
        sentence_classes=max([objectives_lib.SENTENCE_CLASSES[o] for o in sentence], default=2),
        sbo="sbo" in objectives,
        wso="wso" in objectives,
        wklm_mentions=wklm.slots(config) if "wklm" in objectives else 0,
        sample_temperature=config.model.sample_temperature,
    )
  plugin = _plugin(config)
  return plugin.model(config, model, platform) if plugin else model


def dummy_batch(config, batch_size: int = 1) -> dict:
  """A batch of zeros with the shapes of a masked training batch (for init and shape inference)."""
  s, p = config.seq_len, config_lib.max_predictions(config)
  q = masking.shuffle_slots(s, config.masking.wso_share)
  ints = lambda *shape: jnp.zeros(shape, jnp.int32)
  out = dict(input_ids=ints(batch_size, s), original_ids=ints(batch_size, s), type_ids=ints(batch_size, s),
             groups=jnp.ones((batch_size, s), jnp.int32), mlm_positions=ints(batch_size, p),
             mlm_weights=jnp.zeros((batch_size, p)), span_left=ints(batch_size, p), span_right=ints(batch_size, p),
             wso_positions=ints(batch_size, max(q, 1)), wklm_first=ints(batch_size, wklm.slots(config)),
             wklm_last=ints(batch_size, wklm.slots(config)))
  if "plm" in config_lib.active_objectives(config):  # what objectives.plm.inputs adds to a batch
    n = plm_data.num_predict(config)
    out.update(perm_mask=jnp.zeros((batch_size, s, s)), target_mapping=jnp.zeros((batch_size, n, s)),
               plm_positions=ints(batch_size, n), plm_labels=ints(batch_size, n), plm_weights=jnp.zeros((batch_size, n)))
  return out


def host_batch_spec(config, batch_size: int) -> dict:
  """Shapes and dtypes of the batches the loader yields (what the jitted steps take)."""
  s = config.seq_len
  sds = jax.ShapeDtypeStruct
  spec = dict(input_ids=sds((batch_size, s), jnp.int32), type_ids=sds((batch_size, s), jnp.int32),
              word_start=sds((batch_size, s), jnp.bool_), groups=sds((batch_size, s), jnp.int32),
              sentence_label=sds((batch_size,), jnp.int32), example_weight=sds((batch_size,), jnp.float32))
  if prepare_lib.resolve_format(config) == "packed":  # packed rows restart positions per example
    spec["position_ids"] = sds((batch_size, s), jnp.int32)
  if config.data.get("units", ""):  # entity/phrase spans (bertjax.data.units)
    spec["unit_start"], spec["mention"] = sds((batch_size, s), jnp.bool_), sds((batch_size, s), jnp.int32)
  if config.data.get("trees", False):  # tree nodes' spans (bertjax.data.trees)
    spec["node_first"] = spec["node_last"] = sds((batch_size, s), jnp.int32)
  if prepare_lib.resolve_format(config) == "stream":  # XLNet's windows: targets and permutation ranks
    spec["plm_masked"], spec["perm_rank"] = sds((batch_size, s), jnp.bool_), sds((batch_size, s), jnp.int32)
  return spec


def init_params(model: Pretrainer, config, rng):
  """The model's fresh parameters, still carrying their logical-axis boxes."""
  return model.init({"params": rng, "sample": rng, "dropout": rng}, dummy_batch(config))["params"]


def param_shapes(config) -> dict:
  """The Pretrainer's parameter tree as jax.ShapeDtypeStructs (nothing allocated)."""
  model = make_model(config)
  return sharding.strip_boxes(jax.eval_shape(functools.partial(init_params, model, config), jax.random.key(0)))


def has_memory(config) -> bool:
  """Whether the config's model carries a memory from step to step (model.xlnet.mem_len > 0: XLNet's)."""
  return bool((config.model.get("xlnet", None) or {}).get("mem_len", 0))


@dataclasses.dataclass(frozen=True)
class MemorySpec:
  """The memory a model carries for a batch of `batch_size`: its leaves' shapes (jax.ShapeDtypeStructs, the
  model's own layout) and the axis of each leaf that holds the batch (jax.tree.leaves order)."""

  shapes: object
  axes: tuple

  def boxed_zeros(self):
    """The empty memory (zeros), each leaf boxed with the batch's logical axis at its batch axis."""
    names = lambda x, a: tuple(sharding.BATCH if i == a else None for i in range(len(x.shape)))
    leaves = [nn.LogicallyPartitioned(jnp.zeros(x.shape, x.dtype), names=names(x, a))
              for x, a in zip(jax.tree.leaves(self.shapes), self.axes)]
    return jax.tree.unflatten(jax.tree.structure(self.shapes), leaves)


def memory_spec(model, config) -> MemorySpec | None:
  """The MemorySpec of a model with memory (has_memory), read from the outputs["memory"] it returns for batches of
  1 and 2 rows (the axis whose size follows the batch is the batch axis); None for a model without."""
  if not has_memory(config):
    return None

  def memory(rows):
    def run(rng):
      params = sharding.strip_boxes(init_params(model, config, rng))
      return model.apply({"params": params}, dummy_batch(config, rows), rngs={"dropout": rng, "sample": rng})["memory"]
    return jax.eval_shape(run, jax.random.key(0))

  one, two = memory(1), memory(2)
  axes = tuple(next(i for i, (p, q) in enumerate(zip(x.shape, y.shape)) if p != q)
               for x, y in zip(jax.tree.leaves(one), jax.tree.leaves(two)))
  b = config.batch_size
  shapes = jax.tree.unflatten(jax.tree.structure(one), [
      jax.ShapeDtypeStruct(x.shape[:a] + (b,) + x.shape[a + 1:], x.dtype) for x, a in zip(jax.tree.leaves(one), axes)])
  return MemorySpec(shapes, axes)


def init_state(rng, model, tx, config, memory: MemorySpec | None = None) -> step_lib.TrainState:
  """A fresh TrainState whose parameters (and memory: empty, as `memory` says) still carry their logical-axis
  boxes."""
  params = init_params(model, config, rng)
  return step_lib.TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params),
                             memory=None if memory is None else memory.boxed_zeros())


def step_config(config, special: SpecialIds, token_counts=None) -> step_lib.StepConfig:
  """What the steps need besides model and optimizer: seed, masking (with the tokenizer's special ids and, for
  masking.replace_dist=unigram or masking.smoothing, the corpus `token_counts` [vocab]: data.pipeline.
  corpus_token_counts), weighted objectives, microbatches, and which steps the loop logs (phase ends and every
  log_every-th)."""
  if not config.get("teacher") and any(k.startswith("distill_") for k in config_lib.active_objectives(config)):
    raise UserError("the distill_* objectives need a teacher: set --config.teacher to a bertjax workdir or an HF "
                    "checkpoint (python -m bertjax.distill)")
  masking_cfg, eval_masking = masking.make_config(config, special), masking.make_config(config, special, True)
  if masking_cfg.needs_counts:
    if token_counts is None:
      raise ValueError("masking.replace_dist=unigram / masking.smoothing: pass the corpus token counts")
    counts = np.asarray(token_counts, np.int64)
    text = np.delete(counts, [i for i in special.never_masked if i < len(counts)])
    if counts.shape != (config.model.vocab_size,) or text.sum() <= 0:
      raise UserError(f"the corpus token counts ({counts.shape[0]} ids, {text.sum()} text tokens) cannot weigh a "
                      f"vocabulary of {config.model.vocab_size}; prepare the data again")
    token_counts = counts.astype(np.float32)
  else:
    token_counts = None
  return step_lib.StepConfig(
      seed=config.seed, masking=masking_cfg, token_counts=token_counts,
      eval_masking=None if eval_masking == masking_cfg else eval_masking,
      objectives=tuple(config_lib.active_objectives(config).items()), grad_accum_steps=config.grad_accum_steps,
      report_every=config.log_every, report_at=tuple(p.end for p in config_lib.phases(config)),
      wklm_mentions=wklm.slots(config) if "wklm" in config_lib.active_objectives(config) else 0,
      plm=plm.make_config(config, special) if "plm" in config_lib.active_objectives(config) else None)


@dataclasses.dataclass(frozen=True)
class Jitted:
  """A jitted function that is traced, lowered and compiled under the mesh and logical axis rules it was
  made for (the model's logical constraints are resolved at trace time)."""

  fn: object  # the jax.jit-wrapped function
  mesh: jax.sharding.Mesh
  rules: tuple

  def __call__(self, *args):
    with sharding.activate(self.mesh, self.rules):
      return self.fn(*args)

  def lower(self, *args):
    with sharding.activate(self.mesh, self.rules):
      return self.fn.lower(*args)


@dataclasses.dataclass
class Steps:
  """The jitted functions of a run and the shardings they were compiled for."""

  model: Pretrainer
  tx: object
  schedule: object  # step -> learning rate, the one tx follows (what the loop logs as `lr`)
  cfg: step_lib.StepConfig
  state_shardings: object  # TrainState of NamedShardings
  abstract_state: object  # TrainState of ShapeDtypeStructs carrying those shardings (restore target)
  batch_sharding: object
  init: Jitted  # rng -> TrainState, created already sharded
  train: Jitted  # (state, batch) -> (state, metrics); donates state
  eval: Jitted  # (params, batch, index) -> metric sums
  # The state's layout: split per layer (bertjax.model.unstacked) or stacked, as checkpoints hold it. Each of these
  # is the identity on a stacked state.
  stored_state: object = None  # abstract_state stacked: what a checkpoint holds (restore target)
  to_step: Callable = lambda state: state  # a stacked TrainState in the steps' layout
  stored: Callable = lambda state: state  # a TrainState (or its params) in the steps' layout, stacked


def mesh_platform(mesh) -> str:
  """'cpu', 'gpu' or 'tpu': what the mesh's devices are (a TPU topology's, when aot compiles on a CPU host)."""
  platform = mesh.devices.flat[0].platform
  return "gpu" if platform in ("cuda", "rocm") else platform


def attention_notice(config, mesh) -> str:
  """The attention implementation a run on `mesh` uses, and why if not the requested one (one line); raises
  UserError where the requested kernel cannot run there."""
  impl, notice = model_config.resolve_attention(config.model, mesh_platform(mesh))
  return notice or f"attention: {impl}"


def placeholder_counts(config):
  """Token counts of one per id: what a compile without data (aot, bench) binds for masking.replace_dist=unigram
  or masking.smoothing (the program is the same whatever the counts)."""
  return np.ones(config.model.vocab_size, np.int64) if masking.needs_counts(config) else None


def splits_layers(config, platform: str) -> bool:
  """Whether a training loop's state keeps its stacked leaves split per layer on `platform`: where every layer
  of the model runs unrolled (the CPU's default; bertjax.model.unstacked)."""
  return layer_lib.all_unrolled(model_config.encoder_config(config.model, platform=platform))


def _split_abstract(abstract):
  """A stacked abstract TrainState split per layer: each layer's part a ShapeDtypeStruct placed as its stack's
  slice (the stack's sharding without its leading axis)."""
  def part(x, i):
    s = x.sharding
    placed = jax.sharding.NamedSharding(s.mesh, type(s.spec)(*s.spec[1:]))
    return jax.ShapeDtypeStruct(x.shape[1:], x.dtype, sharding=placed)
  return _split_state(abstract, part)


def _split_state(state, part=lambda x, i: x[i]):
  return state.replace(params=unstacked.split(state.params, part), opt_state=unstacked.split(state.opt_state, part))


def _join_state(state):
  if not hasattr(state, "opt_state"):  # a params tree
    return unstacked.join(state)
  return state.replace(params=unstacked.join(state.params), opt_state=unstacked.join(state.opt_state))


def make_steps(config, mesh, special: SpecialIds, token_counts=None, split: bool = False) -> Steps:
  """Builds model, optimizer and the jitted init/train/eval steps with explicit shardings on `mesh`.

  `special` are the run's tokenizer's special ids (masking never picks them); `token_counts` the corpus counts
  that masking.replace_dist=unigram and masking.smoothing draw from (step_config). Parameters are placed by
  their logical axis names through the config's sharding rules; the state is initialized already sharded
  (jit with out_shardings), never built on one host and copied. `split`: the caller holds the state in the
  steps' own layout (`Steps.stored` gives it stacked), so where every layer runs unrolled (`splits_layers`) its
  stacked leaves are split per layer: no per-step slicing of the parameters and concatenation of their
  gradients. Otherwise (and for every caller that reads the state's leaves itself) the state is stacked.
  """
  rules = sharding.config_rules(config)
  schedule = optim.lr_schedule(config)
  model, tx = make_model(config, mesh_platform(mesh)), optim.make(config.optimizer, schedule)
  plugin = _plugin(config)
  if plugin:  # distillation: the teacher is frozen, no updates, no optimizer state
    tx = plugin.tx(config, tx)
  cfg = step_config(config, special, token_counts)
  with nn.logical_axis_rules(rules):
    memory = memory_spec(model, config)  # XLNet's: part of the state, split over devices by its batch axes
    if memory is not None:
      cfg = dataclasses.replace(cfg, memory_axes=memory.axes)
    boxed = jax.eval_shape(functools.partial(init_state, model=model, tx=tx, config=config, memory=memory),
                           jax.random.key(0))
  shardings = sharding.logical_shardings(boxed, mesh, rules)
  abstract = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                          sharding.strip_boxes(boxed), shardings)
  batch_sharding = jax.sharding.NamedSharding(mesh, sharding.batch_spec())
  repl = sharding.replicated(mesh)
  init = jax.jit(lambda r: nn.unbox(init_state(r, model, tx, config, memory)), out_shardings=shardings)
  train = jax.jit(functools.partial(step_lib.train_step, model=model, tx=tx, cfg=cfg),
                  in_shardings=(shardings, batch_sharding), out_shardings=(shardings, repl), donate_argnums=(0,))
  evaluate = jax.jit(functools.partial(step_lib.eval_step, model=model, cfg=cfg),
                     in_shardings=(shardings.params, batch_sharding, repl), out_shardings=repl)
  on_mesh = functools.partial(Jitted, mesh=mesh, rules=rules)
  init = on_mesh(init)
  if plugin:  # distillation: a fresh state holds the teacher's weights (and the student starts from them)
    init = plugin.init(init, config, shardings.params)
  steps = Steps(model, tx, schedule, cfg, shardings, abstract, batch_sharding, init, on_mesh(train),
                on_mesh(evaluate), stored_state=abstract)
  return _split_steps(steps, model, tx, cfg, mesh, rules) if split and splits_layers(config, mesh_platform(mesh)) \
      else steps


def _split_steps(steps: Steps, model, tx, cfg, mesh, rules) -> Steps:
  """`steps` for a state split per layer: train and eval jitted for its shardings, init giving it, and the
  conversions from and to the stacked state."""
  abstract = _split_abstract(steps.abstract_state)
  shardings = jax.tree.map(lambda x: x.sharding, abstract)
  repl = sharding.replicated(mesh)
  on_mesh = functools.partial(Jitted, mesh=mesh, rules=rules)
  train = jax.jit(functools.partial(step_lib.train_step, model=model, tx=tx, cfg=cfg),
                  in_shardings=(shardings, steps.batch_sharding), out_shardings=(shardings, repl), donate_argnums=(0,))
  evaluate = jax.jit(functools.partial(step_lib.eval_step, model=model, cfg=cfg),
                     in_shardings=(shardings.params, steps.batch_sharding, repl), out_shardings=repl)
  to_step = on_mesh(jax.jit(_split_state, out_shardings=shardings))
  stored_params = on_mesh(jax.jit(_join_state, out_shardings=steps.state_shardings.params))
  stored_state = on_mesh(jax.jit(_join_state, out_shardings=steps.state_shardings))
  stored = lambda x: (stored_state if hasattr(x, "opt_state") else stored_params)(x)  # a state, or its params
  return dataclasses.replace(steps, state_shardings=shardings, abstract_state=abstract, train=on_mesh(train),
                             eval=on_mesh(evaluate), init=lambda rng: to_step(steps.init(rng)), to_step=to_step,
                             stored=stored)
