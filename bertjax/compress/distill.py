"""Distilling a pretrained teacher into a smaller student (DistilBERT's triple loss; TinyBERT's layer losses as
options): the run behind `python -m bertjax.distill --config=configs/distill.py:tiny --config.teacher=DIR --workdir=W`.

The run is a pretraining run (`bertjax.train.loop`, same data, masking, schedule, checkpoints and resume) whose
model is a `Distiller`: the student, plus the frozen teacher inside the same jitted, sharded step. The
teacher is a bertjax workdir (a training run or an import) or an HF checkpoint directory; it must share the
student's vocabulary, and an empty `data.tokenizer` takes the teacher's. A fresh student of the teacher's
width starts from its embeddings, the teacher layers distill.student_layers names (default every other one)
and its MLM head (DistilBERT). At the end, W/student is
a plain bertjax workdir of the student alone (`python -m bertjax.hf export --workdir=W/student` writes a
DistilBertForMaskedLM when the student has no segment embeddings); with `distill.compare`, the same student
is also trained without the teacher (same data, seed and steps) in W/baseline and the two are reported side by
side (W/comparison.json).
"""

import functools
import json
import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from bertjax.core import config as config_lib
from bertjax.core.errors import UserError
from bertjax.model import config as model_config
from bertjax.objectives.distill import LAYER_OBJECTIVES, PROJECTED_OBJECTIVES
from bertjax.train import build

TEACHER_PARTS = ("embeddings", "encoder", "mlm")


def _is_workdir(path: str) -> bool:
  return os.path.isdir(os.path.join(path, "checkpoints"))


@functools.lru_cache(maxsize=4)
def teacher_run_config(path: str) -> ml_collections.ConfigDict:
  """The teacher's run config: a bertjax workdir's config.json, or one made from an HF config.json."""
  from bertjax.hf import configs as hf_configs, workdir as wd

  if _is_workdir(path):
    return wd.load_config(path)
  cfg_path = os.path.join(path, "config.json")
  if not os.path.isfile(cfg_path):
    raise UserError(f"--config.teacher={path!r} is neither a bertjax workdir (with checkpoints/) nor an HF "
                    "checkpoint (with config.json)")
  with open(cfg_path) as f:
    hf = json.load(f)
  return hf_configs.from_hf(hf, hf_configs.family_of(hf), {"mlm"})


def teacher_model(config, platform: str | None = None):
  """The teacher's Pretrainer: its main encoder and MLM head (no sentence head, no generator)."""
  from bertjax.model.pretrain import Pretrainer

  t = teacher_run_config(config.teacher)
  if "rtd" in config_lib.active_objectives(t):
    raise UserError("the teacher is an ELECTRA discriminator, which has no MLM head; distil from an MLM model")
  return Pretrainer(cfg=model_config.encoder_config(t.model, platform=platform))


def make_distiller(config, student, platform: str | None = None):
  """The Distiller of `student` (the config's Pretrainer) and the config's teacher (attention
  implementations for `platform`)."""
  from bertjax.model.distill import Distiller, starts_from_teacher

  teacher = teacher_model(config, platform)
  objectives = config_lib.active_objectives(config)
  layers = bool(set(objectives) & set(LAYER_OBJECTIVES))
  s, t = student.cfg, teacher.cfg
  narrower = s.hidden_size != t.hidden_size
  if s.vocab_size != t.vocab_size:
    raise UserError(f"model.vocab_size={s.vocab_size} but the teacher's is {t.vocab_size}; the student must share "
                    "the teacher's vocabulary (set --config.model.vocab_size to it)")
  if "distill_cos" in objectives and narrower:
    raise UserError(f"distill_cos compares final hidden states, which needs the teacher's width ({t.hidden_size}, "
                    f"student {s.hidden_size}); set --config.objectives.distill_cos=0")
  if "distill_embedding" in objectives and (s.embedding_size != s.hidden_size or t.embedding_size != t.hidden_size):
    raise UserError("distill_embedding compares embedding outputs of the hidden width; a factorized embedding "
                    "(model.embedding_size) has another; set --config.objectives.distill_embedding=0")
  if "distill_attention" in objectives and s.num_heads != t.num_heads:
    raise UserError(f"distill_attention needs the teacher's head count ({t.num_heads}, student {s.num_heads}); "
                    "set --config.objectives.distill_attention=0")
  if "distill_attention" in objectives and (s.attention, t.attention) != ("xla", "xla"):
    raise UserError("distill_attention compares attention maps, which only the xla attention forms; set "
                    "--config.model.attention=xla")
  if layers and s.num_layers > t.num_layers:
    raise UserError(f"the student has more layers ({s.num_layers}) than the teacher ({t.num_layers})")
  chosen = tuple(config.distill.get("student_layers", ()))
  if chosen and (len(chosen) != s.num_layers or not all(0 <= i < t.num_layers for i in chosen)):
    raise UserError(f"distill.student_layers={list(chosen)} must name {s.num_layers} teacher layers (one per "
                    f"student layer) between 0 and {t.num_layers - 1}")
  if chosen and narrower:
    raise UserError("distill.student_layers copies teacher layers, which needs the teacher's width "
                    f"({t.hidden_size}, student {s.hidden_size}); set --config.distill.student_layers='()'")
  if config.distill.get("freeze_position_embeddings") and not starts_from_teacher(s, t, chosen or None):
    raise UserError("distill.freeze_position_embeddings keeps the position table copied from the teacher, which this "
                    "student does not get (another width, or deeper than half the teacher without "
                    "distill.student_layers); set it to False")
  return Distiller(student, teacher, temperature=config.distill.temperature, layer_outputs=layers,
                   all_positions="distill_ce" in objectives,
                   project=narrower and bool(set(objectives) & set(PROJECTED_OBJECTIVES)))


def is_frozen(config):
  """A predicate on a parameter's path (its keys): whether the optimizer leaves that parameter alone, as the
  teacher and, with distill.freeze_position_embeddings, the student's position table."""
  freeze_positions = bool(config.distill.get("freeze_position_embeddings"))
  return lambda keys: keys[0] == "teacher" or (freeze_positions and tuple(keys[:3]) == ("student", "embeddings",
                                                                                      "position"))


def _zero_frozen(config) -> optax.GradientTransformation:
  """Zeroes the updates of the frozen student parameters (stateless)."""
  frozen = is_frozen(config)
  keys = lambda path: [getattr(k, "key", None) for k in path]

  def update(updates, state, params=None):
    del params
    return jax.tree_util.tree_map_with_path(lambda p, u: jnp.zeros_like(u) if frozen(keys(p)) else u, updates), state

  return optax.GradientTransformation(lambda _: optax.EmptyState(), update)


def freeze_teacher(tx, config) -> optax.GradientTransformation:
  """`tx` for the student's parameters; none (no update, no state) for the teacher's. With
  distill.freeze_position_embeddings the student's position table (DistilBERT's requires_grad=False table)
  gets a zero gradient before `tx` (so it adds nothing to the clipped global norm and Adam's moments stay 0)
  and a zero update after it (so no weight decay either)."""
  labels = lambda params: {k: "frozen" if k == "teacher" else "train" for k in params}
  if config.distill.get("freeze_position_embeddings"):
    tx = optax.chain(_zero_frozen(config), tx, _zero_frozen(config))
  return optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)


def load_teacher(path: str):
  """(run config, params {embeddings, encoder, mlm} as numpy, tokenizer or None) of a teacher."""
  from bertjax.hf import inference

  loaded = inference.load(workdir=path) if _is_workdir(path) else inference.load(hf_dir=path)
  missing = [p for p in TEACHER_PARTS if p not in loaded.params]
  if missing or any(p.startswith("mlm/") for p in loaded.fresh):
    raise UserError(f"the teacher at {path} has no MLM head (e.g. a bare BertModel); distil from a *ForMaskedLM, "
                    "*ForPreTraining or a bertjax MLM run")
  return loaded.config, {k: loaded.params[k] for k in TEACHER_PARTS}, loaded.tokenizer


def initializer(init, config, param_shardings):
  """A state initializer (rng -> TrainState) that puts the teacher's weights in and, when the student has
  the teacher's width, starts the student from them (bertjax.model.distill.student_from_teacher)."""
  from bertjax.model.distill import student_from_teacher

  def run(rng):
    state = init(rng)
    teacher_config, teacher, _ = load_teacher(config.teacher)
    chosen = tuple(config.distill.get("student_layers", ())) or None
    student_params, copied = student_from_teacher(
        jax.device_get(state.params["student"]), teacher, model_config.encoder_config(config.model),
        model_config.encoder_config(teacher_config.model), chosen)
    print(f"student initialized from the teacher: {', '.join(copied)}" if copied else
          "student initialized at random (its width differs from the teacher's)", flush=True)
    params = dict(state.params, teacher=teacher, student=student_params)
    params = jax.tree.map(lambda x, s: jax.device_put(np.asarray(x, np.float32), s), params, param_shardings)
    return state.replace(params=params)

  return run


def baseline_config(config) -> ml_collections.ConfigDict:
  """The same run without the teacher: the student alone, MLM only, same data, seed and steps."""
  c = ml_collections.ConfigDict(config.to_dict())
  c.teacher = ""
  for name in list(c.objectives):
    if name.startswith("distill_"):
      c.objectives[name] = 0.0
  return c


def save_student(config, params, tokenizer_spec: str, directory: str):
  """W/student: the student alone as a bertjax workdir (config.json + params), what inference, fine-tuning
  and `bertjax.hf export` read."""
  from bertjax.hf import workdir as wd

  c = baseline_config(config)
  c.data.tokenizer = tokenizer_spec
  wd.write(directory, c, params, dict(distilled_from=config.teacher, tokenizer=dict(spec=tokenizer_spec)))


def _final_eval(workdir: str) -> dict:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    evals = [json.loads(line) for line in f if '"eval/' in line]
  return {k: v for k, v in evals[-1].items() if k.startswith("eval/") or k == "step"} if evals else {}


def run(config, workdir: str) -> dict:
  """Distils (and with distill.compare trains the baseline); returns the final evals side by side."""
  from bertjax.train import loop

  if not config.teacher:
    raise UserError("set --config.teacher to the teacher: a bertjax workdir or an HF checkpoint directory")
  teacher_config, _, tok = load_teacher(config.teacher)
  if not config.data.tokenizer:
    if tok is None:
      raise UserError(f"the teacher at {config.teacher} has no tokenizer; set --config.data.tokenizer to its vocabulary")
    config.data.tokenizer = tok.spec()  # the student reads its data with the teacher's tokenizer
  print(f"teacher {config.teacher}: {teacher_config.model.num_layers} layers, hidden {teacher_config.model.hidden_size}; "
        f"student {config.model.num_layers} layers, hidden {config.model.hidden_size}; tokenizer {config.data.tokenizer}",
        flush=True)
  state = loop.train_and_evaluate(config, workdir)
  save_student(config, jax.device_get(state.params["student"]), config.data.tokenizer, os.path.join(workdir, "student"))
  result = {"distilled": _final_eval(workdir)}
  if config.distill.compare:
    print("training the same student without the teacher (distill.compare)", flush=True)
    loop.train_and_evaluate(baseline_config(config), os.path.join(workdir, "baseline"))
    result["without_teacher"] = _final_eval(os.path.join(workdir, "baseline"))
    keys = [k for k in result["distilled"] if k.startswith("eval/mlm")]
    print(f"{'':24s}{'distilled':>12s}{'no teacher':>12s}")
    for k in keys:
      print(f"{k:24s}{result['distilled'][k]:12.4f}{result['without_teacher'].get(k, float('nan')):12.4f}")
  with open(os.path.join(workdir, "comparison.json"), "w") as f:
    json.dump(result, f, indent=2)
  print(f"student written to {os.path.join(workdir, 'student')}", flush=True)
  return result


# Distillation plugs into the model factory from above: for a config with a teacher, build makes the Distiller
# (student + frozen teacher), freezes the teacher's parameters and loads them into a fresh state.
build.register(build.Plugin(applies=lambda config: bool(config.get("teacher")) and not config.get("transfer"),
                            model=make_distiller,
                            tx=lambda config, tx: freeze_teacher(tx, config), init=initializer))
