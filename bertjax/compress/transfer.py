"""MobileBERT's progressive knowledge transfer and pre-training distillation (Sun et al. 2020; google-research
mobilebert run_pretraining.py, lamb_optimizer.py, distill_util.py): the run behind
`python -m bertjax.distill --config=configs/mobilebert.py:tiny_transfer --config.teacher=DIR --workdir=W`.

Stage 1, W/transfer (`transfer.steps` steps, L phases of steps // L, one student layer active per phase): the
student starts with every parameter outside its encoder copied from the teacher (embeddings, their projection,
the MLM and sentence heads; not the embedding norm when the norms differ, as the reference's names differ) and
learns each layer's feature maps, attention distributions, means and variances (bertjax.objectives.transfer)
under LAMB as the reference runs it (`layerwise_lamb`): the active layer at 3 bg, finished layers at 0.3 bg,
later layers and everything outside the encoder frozen (exactly zero update), every layer's moments reset where
its multiplier is 0 (bertjax.model.transfer has the schedule). The multipliers follow the optimizer's own count
of updates, which equals the run's step unless a non-finite step was skipped (the loss gates follow the step).
Stage 2, W/distill (the config's own steps, schedule and objectives: MLM against 0.5 one-hot + 0.5 teacher,
i.e. mlm 0.5 + distill_ce_masked 0.5 at temperature 1, plus NSP on ground truth): everything trains, from the
stage-1 student, with a fresh LAMB state and step 0 (the reference's new model_dir).
W/student is the student alone (a plain bertjax workdir); with distill.compare the same student is trained
from scratch (MLM + NSP, the two stages' steps together) in W/baseline, and W/comparison.json holds both evals.
"""

import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bertjax.compress import distill
from bertjax.core.errors import UserError
from bertjax.model import unstacked
from bertjax.model.transfer import Transfer, lr_multipliers
from bertjax.objectives.transfer import OBJECTIVES
from bertjax.train import build, optim

STAGES = ("pkt", "pd")


def stage(config) -> str:
  """pkt (progressive knowledge transfer) or pd (pre-training distillation) for a transfer config, else ''."""
  t = config.get("transfer")
  return t.get("stage", "pd") if t and config.get("teacher") else ""


def steps_per_phase(config) -> int:
  return max(1, config.transfer.steps // config.model.num_layers)


def make_model(config, student, platform: str | None = None) -> Transfer:
  """The Transfer of `student` and the config's teacher; checks that the pair can be compared layer by layer."""
  teacher = distill.teacher_model(config, platform)
  s, t = student.cfg, teacher.cfg
  for key in ("vocab_size", "hidden_size", "num_heads", "num_layers"):
    if getattr(s, key) != getattr(t, key):
      raise UserError(f"progressive transfer compares the student's layers with the teacher's one to one: model.{key}="
                      f"{getattr(s, key)} but the teacher's is {getattr(t, key)}; set --config.model.{key}")
  if stage(config) == "pkt" and (s.attention, t.attention) != ("xla", "xla"):
    raise UserError("attention transfer compares attention scores, which only the xla attention forms; set "
                    "--config.model.attention=xla")
  return Transfer(student, teacher, temperature=1.0, layers=stage(config) == "pkt",
                  steps_per_phase=steps_per_phase(config),
                  all_layer_statistics=config.transfer.teacher_statistics == "all_layers")


def _keys(path):
  return tuple(getattr(k, "key", None) for k in path)


def _is_layer(keys) -> bool:
  """Whether a parameter belongs to the student's scanned layers ([L, ...] stacked)."""
  return keys[:3] == ("student", "encoder", "layers")


def _multiplier_tree(tree, multipliers):
  """Per leaf of `tree`: its layer's multiplier broadcast over a stacked leaf, 0 outside the layers."""
  def one(path, x):
    if not _is_layer(_keys(path)):
      return jnp.zeros((), x.dtype)
    if unstacked.layer_of(path) is not None:  # one layer's part of a leaf split per layer
      return multipliers[unstacked.layer_of(path)].astype(x.dtype)
    return multipliers.reshape((-1,) + (1,) * (x.ndim - 1)).astype(x.dtype)
  return jax.tree_util.tree_map_with_path(one, tree)


def by_layer(inner: optax.GradientTransformation, multipliers) -> optax.GradientTransformation:
  """`inner` with each update scaled by its layer's multiplier at this step (`multipliers`: step -> [L]; 0
  outside the layers) and `inner`'s moments reset where the multiplier is 0 (lamb_optimizer.py's
  layer_wise_gate on next_m and next_v)."""

  def init(params):
    return (jnp.zeros([], jnp.int32), inner.init(params))

  def update(updates, state, params=None):
    count, inner_state = state
    m = multipliers(count)
    updates, inner_state = inner.update(updates, inner_state, params)
    gates = _multiplier_tree(updates, (m > 0).astype(jnp.float32))
    moments = inner_state[0]  # optim.scale_by_adam_moments' (mu, nu), first in the chain
    moments = type(moments)(*(jax.tree.map(jnp.multiply, x, gates) for x in moments))
    inner_state = (moments,) + tuple(inner_state[1:])
    return jax.tree.map(jnp.multiply, updates, _multiplier_tree(updates, m)), (count + 1, inner_state)

  return optax.GradientTransformation(init, update)


def layerwise_lamb(o, learning_rate, multipliers) -> optax.GradientTransformation:
  """LAMB as google-research mobilebert lamb_optimizer.py runs progressive transfer, from optax pieces: global
  norm clipping, Adam's moments without bias correction, decoupled weight decay and the per-tensor trust ratio
  on all but biases and norms (its exclusion list: LayerNorm, layer_norm, bias, FakeLayerNorm), the learning
  rate, then each layer's multiplier (`multipliers`: step -> [L]) with moments reset where it is 0."""
  lamb = optax.chain(
      optim.scale_by_adam_moments(o.b1, o.b2, o.eps),
      optax.add_decayed_weights(o.weight_decay, mask=optim.decay_mask),
      optax.masked(optim.per_tensor_trust_ratio(), optim.decay_mask),
      optax.scale_by_learning_rate(learning_rate),
  )
  tx = by_layer(lamb, multipliers)
  return optax.chain(optax.clip_by_global_norm(o.clip_norm), tx) if o.clip_norm else tx


def make_tx(config, tx):
  """Stage 1: the teacher frozen, the student under layerwise_lamb; stage 2: the config's optimizer (tx) with
  the teacher frozen."""
  if stage(config) != "pkt":
    return distill.freeze_teacher(tx, config)
  spp, n = steps_per_phase(config), config.model.num_layers
  student = layerwise_lamb(config.optimizer, optim.lr_schedule(config), lambda t: lr_multipliers(t, spp, n))
  labels = lambda params: {k: "frozen" if k == "teacher" else "train" for k in params}
  return optax.multi_transform({"train": student, "frozen": optax.set_to_zero()}, labels)


def _load(path: str, hf: bool = False) -> dict:
  from bertjax.hf import inference

  loaded = inference.load(hf_dir=path) if hf else inference.load(workdir=path)
  params = dict(loaded.params)
  if loaded.pooler is not None:
    params["pooler"] = loaded.pooler
  return params


def copy_outside_encoder(student: dict, teacher: dict, student_norm: str, teacher_norm: str) -> tuple:
  """(student params, copied paths): every student parameter outside the encoder that the teacher has at the
  same path and shape, from the teacher (run_pretraining.py's init_embedding); the embedding norm only when both
  use the same norm (the reference's NoNorm and LayerNorm have different names, so it is never copied there)."""
  copied = []

  def pick(path, x):
    keys = _keys(path)
    node = teacher
    for k in keys:
      node = node.get(k) if isinstance(node, dict) else None
    same_norm = student_norm == teacher_norm or keys[:2] != ("embeddings", "ln")
    if keys[0] != "encoder" and node is not None and np.shape(node) == np.shape(x) and same_norm:
      copied.append("/".join(keys))
      return np.asarray(node)
    return np.asarray(x)

  return jax.tree_util.tree_map_with_path(pick, student), copied


def initializer(init, config, param_shardings):
  """A state initializer: the teacher's weights in; the student's parameters outside its encoder from the
  teacher and, in stage 2, everything stage 1 trained (transfer.student)."""

  def run(rng):
    state = init(rng)
    teacher_config = distill.teacher_run_config(config.teacher)
    teacher = _load(config.teacher, hf=not distill._is_workdir(config.teacher))
    student, copied = copy_outside_encoder(jax.device_get(state.params["student"]), teacher, config.model.norm,
                                           teacher_config.model.norm)
    print(f"student: {', '.join(copied)} from the teacher", flush=True)
    if stage(config) == "pd" and config.transfer.get("student"):
      trained = _load(config.transfer.student)
      student = {k: trained.get(k, v) for k, v in student.items()}
      print(f"student: {', '.join(k for k in student if k in trained)} from {config.transfer.student}", flush=True)
    t = {k: teacher[k] for k in state.params["teacher"]}
    params = dict(state.params, teacher=t, student=student)
    params = jax.tree.map(lambda x, s: jax.device_put(np.asarray(x, np.float32), s), params, param_shardings)
    return state.replace(params=params)

  return run


def transfer_config(config) -> ml_collections.ConfigDict:
  """Stage 1's run config: transfer.steps at transfer.learning_rate (constant), the four transfer losses weighed
  by transfer.factors / L, no MLM or NSP."""
  c = ml_collections.ConfigDict(config.to_dict())
  t, n = c.transfer, c.model.num_layers
  c.transfer.stage = "pkt"
  c.total_steps, c.learning_rate, c.warmup_steps, c.warmup_fraction = t.steps, t.learning_rate, 0, 0.0
  c.optimizer.schedule, c.optimizer.bias_correction = "constant", False
  c.phases = ()
  c.model.attention = "xla"
  c.objectives = {k: 0.0 for k in c.objectives}
  for name, factor in zip(OBJECTIVES, (t.hidden_factor, t.attention_factor, t.beta, t.gamma)):
    c.objectives[name] = factor / n
  return c


def distill_config(config, student_dir: str) -> ml_collections.ConfigDict:
  """Stage 2's run config: the config itself, starting from the stage-1 student at `student_dir`."""
  c = ml_collections.ConfigDict(config.to_dict())
  c.transfer.stage, c.transfer.student = "pd", student_dir
  return c


def scratch_config(config) -> ml_collections.ConfigDict:
  """The same student trained from scratch without the teacher: MLM + NSP for both stages' steps."""
  c = ml_collections.ConfigDict(config.to_dict())
  c.teacher = ""
  del c["transfer"]
  c.total_steps = config.total_steps + config.transfer.steps
  c.objectives = {k: (1.0 if k in ("mlm", "nsp") else 0.0) for k in c.objectives}
  return c


def save_student(config, params, directory: str):
  """`directory`: the student alone as a plain bertjax workdir (MLM + NSP config)."""
  from bertjax.hf import workdir as wd

  c = scratch_config(config)
  c.total_steps = config.total_steps
  c.objectives.nsp = 1.0 if "sentence" in params else 0.0
  wd.write(directory, c, params, dict(distilled_from=config.teacher, tokenizer=dict(spec=config.data.tokenizer)))


def run(config, workdir: str) -> dict:
  """`python -m bertjax.distill`: progressive transfer then pre-training distillation for a config with a
  `transfer` section; plain distillation (bertjax.compress.distill.run) otherwise."""
  import json

  from bertjax.train import loop

  if not config.get("transfer"):
    return distill.run(config, workdir)
  if not config.teacher:
    raise UserError("set --config.teacher to the IB-BERT teacher: a bertjax workdir or an HF checkpoint directory")
  _, _, tok = distill.load_teacher(config.teacher)
  if not config.data.tokenizer:
    if tok is None:
      raise UserError(f"the teacher at {config.teacher} has no tokenizer; set --config.data.tokenizer to its vocabulary")
    config.data.tokenizer = tok.spec()
  first = os.path.join(workdir, "transfer")
  if config.transfer.steps:
    print(f"progressive knowledge transfer: {config.model.num_layers} phases of {steps_per_phase(config)} steps",
          flush=True)
    c1 = transfer_config(config)
    state = loop.train_and_evaluate(c1, first)
    save_student(c1, jax.device_get(state.params["student"]), os.path.join(first, "student"))
  print("pre-training distillation", flush=True)
  c2 = distill_config(config, os.path.join(first, "student") if config.transfer.steps else "")
  state = loop.train_and_evaluate(c2, os.path.join(workdir, "distill"))
  save_student(c2, jax.device_get(state.params["student"]), os.path.join(workdir, "student"))
  result = {"distilled": distill._final_eval(os.path.join(workdir, "distill"))}
  if config.distill.compare:
    print("training the same student from scratch (distill.compare)", flush=True)
    loop.train_and_evaluate(scratch_config(config), os.path.join(workdir, "baseline"))
    result["without_teacher"] = distill._final_eval(os.path.join(workdir, "baseline"))
  for name, ev in result.items():
    print(f"{name}: eval/mlm_accuracy {ev.get('eval/mlm_accuracy', float('nan')):.4f}", flush=True)
  with open(os.path.join(workdir, "comparison.json"), "w") as f:
    json.dump(result, f, indent=2)
  print(f"student written to {os.path.join(workdir, 'student')}", flush=True)
  return result


# Plugs in before plain distillation (build takes the first plugin that applies): configs with a teacher and a
# `transfer` section.
build.register(build.Plugin(applies=lambda config: bool(stage(config)), model=make_model, tx=make_tx,
                            init=initializer))
