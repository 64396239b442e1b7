"""Knowledge distillation's model: a student Pretrainer trained against a frozen teacher in one forward pass.

`Distiller` holds both networks' parameters (`student`, `teacher`) and runs each through its own
`Pretrainer.apply`, so the teacher runs inside the same jitted, sharded train step as the student (no second
process) and under stop_gradient; the optimizer leaves `teacher` alone (build.make_steps). Its outputs are
what the distillation objectives (bertjax.objectives.distill) score: the student's MLM logits (for its own
MLM loss), both networks' MLM logits (at the masked slots, and at every position for DistilBERT's KL over all
tokens) in temperature-ready form, their embedding outputs and final hidden states, and, when a layer loss
is on, every layer's hidden states and attention maps (the values the encoder sows). A student narrower than
the teacher reaches the teacher's width through TinyBERT's learned projection (`projection`).
"""

from typing import Optional

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from bertjax.core import sharding as sh
from bertjax.model.hparams import EncoderConfig
from bertjax.model.layer import sown_by_layers
from bertjax.model.layers import dense
from bertjax.model.pretrain import Pretrainer


def _forward(m: Pretrainer, batch, all_positions: bool = False):
  """(embedding output, final hidden states, MLM logits) of a (bound) Pretrainer: the logits at every
  position with `all_positions`, else at the masked slots."""
  ids = batch["input_ids"]
  emb = m.embeddings(ids, batch["type_ids"], m.deterministic, batch.get("position_ids"), batch["groups"])
  hidden = m.encoder(emb, batch["groups"])
  positions = jnp.broadcast_to(jnp.arange(ids.shape[1]), ids.shape) if all_positions else batch["mlm_positions"]
  return emb, hidden, m.mlm(hidden, positions, m.embeddings)


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
  all_positions: bool = False  # MLM logits of both networks at every position (DistilBERT's KL over all tokens)
  # TinyBERT's learned projection (fit_dense: student hidden -> teacher hidden, one for the embeddings and every
  # layer), for a student narrower than the teacher; its parameters are `projection`, trained with the student.
  project: bool = False
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
    return {"student": ["student"], "teacher": ["teacher"], **({"projection": ["projection"]} if self.project else {})}

  def train_flops_per_token(self, seq_len: int, max_predictions: int, wso_positions: int = 0) -> float:
    """The student's training FLOPs per token plus the frozen teacher's forward pass (a third of its
    training FLOPs: no backward), both through their MLM heads (at every position for the KL over all tokens;
    TinyBERT's projection is left out, as the attention maps' MSE is)."""
    if self.all_positions:
      max_predictions = seq_len
    teacher = self.teacher_model.train_flops_per_token(seq_len, max_predictions) / 3.0
    return self.student_model.train_flops_per_token(seq_len, max_predictions, wso_positions) + teacher

  def network_params(self, batch):
    """(student params, teacher params): the two networks' parameters, initialized (at init) from `batch`'s fields."""
    dummy = {k: batch[k] for k in ("input_ids", "type_ids", "groups", "mlm_positions", "mlm_weights",
                                   "original_ids")}
    init = lambda model: (lambda rng: model.init({"params": rng, "dropout": rng, "sample": rng}, dummy)["params"])
    student = self.param("student", init(self.student_model))
    teacher = self.param("teacher", init(self.teacher_model))
    return student, teacher

  @nn.compact
  def __call__(self, batch):
    student_params, teacher_params = self.network_params(batch)
    mutable = ["intermediates"] if self.layer_outputs else False
    student = self.student_model.clone(deterministic=self.deterministic, parent=None)
    rngs = {} if self.deterministic else {"dropout": self.make_rng("dropout")}
    s_out = student.apply({"params": student_params}, batch, self.all_positions, rngs=rngs, method=_forward,
                          mutable=mutable)
    t_out = self.teacher_model.clone(deterministic=True, parent=None).apply(
        {"params": jax.lax.stop_gradient(teacher_params)}, batch, self.all_positions, method=_forward, mutable=mutable)
    (s_emb, s_hidden, s_logits), s_sown = s_out if self.layer_outputs else (s_out, None)
    (t_emb, t_hidden, t_logits), t_sown = t_out if self.layer_outputs else (t_out, None)
    t_logits = jax.lax.stop_gradient(t_logits)
    at_slots = lambda x: jnp.take_along_axis(x, batch["mlm_positions"][..., None], axis=1)
    s_masked, t_masked = (at_slots(s_logits), at_slots(t_logits)) if self.all_positions else (s_logits, t_logits)
    t = self.temperature
    out = dict(mlm_logits=s_masked, kd_masked_student_logits=s_masked / t, kd_masked_teacher_logits=t_masked / t,
               kd_scale=jnp.float32(t * t), student_hidden=s_hidden, teacher_hidden=jax.lax.stop_gradient(t_hidden),
               teacher_embedding=jax.lax.stop_gradient(t_emb))
    if self.all_positions:
      out.update(kd_student_logits=s_logits / t, kd_teacher_logits=t_logits / t)
    s_cfg, t_cfg = self.student_model.cfg, self.teacher_model.cfg
    project = (dense(s_cfg, s_cfg.hidden_size, t_cfg.hidden_size, (sh.EMBED, None), "projection") if self.project
               else lambda x: x)
    out["student_embedding"] = project(s_emb)
    if self.layer_outputs:
      idx = layer_map(s_cfg.num_layers, t_cfg.num_layers)
      out["student_layers"] = project(sown_by_layers(s_sown, "hidden"))
      out["teacher_layers"] = jax.lax.stop_gradient(sown_by_layers(t_sown, "hidden")[idx])
      out["student_attention"] = sown_by_layers(s_sown, "attention_probs")
      out["teacher_attention"] = jax.lax.stop_gradient(sown_by_layers(t_sown, "attention_probs")[idx])
    return out


def starts_from_teacher(student: EncoderConfig, teacher: EncoderConfig, layers=None) -> bool:
  """Whether student_from_teacher copies the teacher into this student: the same width and no sharing, and
  with `layers` None a student at most half as deep (every other teacher layer)."""
  same_width = all(getattr(student, k) == getattr(teacher, k) for k in
                   ("hidden_size", "num_heads", "intermediate_size", "embedding_size", "vocab_size", "head_dim"))
  deep_enough = layers is not None or 2 * (student.num_layers - 1) < teacher.num_layers
  return same_width and deep_enough and teacher.sharing == "none" and student.sharing == "none"


def student_from_teacher(student_params: dict, teacher_params: dict, student: EncoderConfig,
                         teacher: EncoderConfig, layers=None) -> tuple:
  """(params, what was copied): DistilBERT's initialization of a student of the teacher's width from the
  teacher: embeddings (without the segment table if the student has none), the teacher layers `layers`
  (0-based, one per student layer; None: every other one, 0, 2, 4, ...) and the MLM head. A student that
  does not start from the teacher (starts_from_teacher) keeps its random initialization (returned with an
  empty list)."""
  if not starts_from_teacher(student, teacher, layers):
    return student_params, []
  if layers is None:
    layers = np.arange(student.num_layers) * 2
  layers = np.asarray(layers, np.int64)
  out = jax.tree.map(np.asarray, student_params)
  t = jax.tree.map(np.asarray, teacher_params)
  copied = []
  for name in ("word", "position", "ln"):
    out["embeddings"][name] = t["embeddings"][name]
    copied.append(f"embeddings/{name}")
  if "type" in out["embeddings"] and "type" in t["embeddings"]:
    out["embeddings"]["type"] = t["embeddings"]["type"][:student.type_vocab_size]
    copied.append("embeddings/type")
  out["encoder"]["layers"] = jax.tree.map(lambda x: x[layers], t["encoder"]["layers"])
  copied.append(f"encoder/layers <- teacher layers {layers.tolist()}")
  if "mlm" in t:
    out["mlm"] = t["mlm"]
    copied.append("mlm")
  return out, copied
