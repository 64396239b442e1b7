"""Knowledge distillation's model: a student Pretrainer trained against a frozen teacher in one forward pass.

`Distiller` holds both networks' parameters (`student`, `teacher`) and runs each through its own
`Pretrainer.apply`, so the teacher runs inside the same jitted, sharded train step as the student (no second
process) and under stop_gradient; the optimizer leaves `teacher` alone (build.make_steps). Its outputs are
what the distillation objectives (bertjax.objectives.distill) score: the student's MLM logits (for its own
MLM loss), both networks' MLM logits and final hidden states at temperature-ready form, and, when a layer
loss is on, every layer's hidden states and attention maps (the values the encoder sows).
"""

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from bertjax.model.encoder import EncoderConfig, sown_by_layers
from bertjax.model.pretrain import Pretrainer


def _forward(m: Pretrainer, batch):
  """Final hidden states and MLM logits at the masked positions of a (bound) Pretrainer."""
  hidden = m.encode(batch["input_ids"], batch["type_ids"], batch["groups"], batch.get("position_ids"))
  return hidden, m.mlm(hidden, batch["mlm_positions"], m.embeddings)


def layer_map(student_layers: int, teacher_layers: int) -> np.ndarray:
  """TinyBERT's uniform mapping: student layer m (1-based) learns from teacher layer m x L_t / L_s."""
  return (np.arange(1, student_layers + 1) * teacher_layers // student_layers) - 1


class Distiller(nn.Module):
  """Student + frozen teacher. `cfg`, `generator` and `sentence_head` describe the student; `networks` and
  `train_flops_per_token` the pair (what the loop, the FLOP count and the manifest read of a model)."""

  # The two networks' definitions, run with their own apply on the parameter trees `student` and `teacher`.
  student_model: Pretrainer
  teacher_model: Pretrainer
  temperature: float = 2.0
  layer_outputs: bool = False  # also every layer's hidden states and attention maps (TinyBERT's losses)
  deterministic: bool = True

  @property
  def cfg(self) -> EncoderConfig:
    return self.student_model.cfg

  @property
  def generator(self) -> Optional[EncoderConfig]:
    return None

  @property
  def sentence_head(self) -> bool:
    return False

  @property
  def networks(self) -> dict:
    """The two networks' parameter groups (the student alone is written to W/student at the end)."""
    return {"student": ["student"], "teacher": ["teacher"]}

  def train_flops_per_token(self, seq_len: int, max_predictions: int, wso_positions: int = 0) -> float:
    """The student's training FLOPs per token plus the frozen teacher's forward pass (a third of its
    training FLOPs: no backward), both through their MLM heads."""
    teacher = self.teacher_model.train_flops_per_token(seq_len, max_predictions) / 3.0
    return self.student_model.train_flops_per_token(seq_len, max_predictions, wso_positions) + teacher

  @nn.compact
  def __call__(self, batch):
    dummy = {k: batch[k] for k in ("input_ids", "type_ids", "groups", "mlm_positions", "mlm_weights",
                                   "original_ids")}
    init = lambda model: (lambda rng: model.init({"params": rng, "dropout": rng, "sample": rng}, dummy)["params"])
    student_params = self.param("student", init(self.student_model))
    teacher_params = self.param("teacher", init(self.teacher_model))
    mutable = ["intermediates"] if self.layer_outputs else False
    student = self.student_model.clone(deterministic=self.deterministic, parent=None)
    rngs = {} if self.deterministic else {"dropout": self.make_rng("dropout")}
    s_out = student.apply({"params": student_params}, batch, rngs=rngs, method=_forward, mutable=mutable)
    t_out = self.teacher_model.clone(deterministic=True, parent=None).apply(
        {"params": jax.lax.stop_gradient(teacher_params)}, batch, method=_forward, mutable=mutable)
    (s_hidden, s_logits), s_sown = s_out if self.layer_outputs else (s_out, None)
    (t_hidden, t_logits), t_sown = t_out if self.layer_outputs else (t_out, None)
    t = self.temperature
    out = dict(mlm_logits=s_logits, kd_student_logits=s_logits / t,
               kd_teacher_logits=jax.lax.stop_gradient(t_logits) / t, kd_scale=jnp.float32(t * t),
               student_hidden=s_hidden, teacher_hidden=jax.lax.stop_gradient(t_hidden))
    if self.layer_outputs:
      idx = layer_map(self.student_model.cfg.num_layers, self.teacher_model.cfg.num_layers)
      out["student_layers"] = sown_by_layers(s_sown, "hidden")
      out["teacher_layers"] = jax.lax.stop_gradient(sown_by_layers(t_sown, "hidden")[idx])
      out["student_attention"] = sown_by_layers(s_sown, "attention_probs")
      out["teacher_attention"] = jax.lax.stop_gradient(sown_by_layers(t_sown, "attention_probs")[idx])
    return out


def student_from_teacher(student_params: dict, teacher_params: dict, student: EncoderConfig,
                         teacher: EncoderConfig) -> tuple:
  """(params, what was copied): DistilBERT's initialization of a student of the teacher's width from the
  teacher: embeddings (without the segment table if the student has none), every other teacher layer
  (0, 2, 4, ...) and the MLM head. A student of another width, or deeper than half the teacher, keeps its
  random initialization (returned with an empty list)."""
  same_width = all(getattr(student, k) == getattr(teacher, k) for k in
                   ("hidden_size", "num_heads", "intermediate_size", "embedding_size", "vocab_size", "head_dim"))
  if not same_width or 2 * (student.num_layers - 1) >= teacher.num_layers or teacher.sharing != "none" \
      or student.sharing != "none":
    return student_params, []
  out = jax.tree.map(np.asarray, student_params)
  t = jax.tree.map(np.asarray, teacher_params)
  copied = []
  for name in ("word", "position", "ln"):
    out["embeddings"][name] = t["embeddings"][name]
    copied.append(f"embeddings/{name}")
  if "type" in out["embeddings"] and "type" in t["embeddings"]:
    out["embeddings"]["type"] = t["embeddings"]["type"][:student.type_vocab_size]
    copied.append("embeddings/type")
  every_other = np.arange(student.num_layers) * 2
  out["encoder"]["layers"] = jax.tree.map(lambda x: x[every_other], t["encoder"]["layers"])
  copied.append(f"encoder/layers <- teacher layers {every_other.tolist()}")
  if "mlm" in t:
    out["mlm"] = t["mlm"]
    copied.append("mlm")
  return out, copied
