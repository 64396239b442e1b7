"""MobileBERT's progressive knowledge transfer (Sun et al. 2020; google-research mobilebert run_pretraining.py
`layer_wise_warmup`, distill_util.py): the model that runs a student and its frozen teacher with every layer's
outputs, and the per-layer schedule of the transfer's phases.

Schedule (distill_util.py; t = the global step before the update, p = steps per phase, l = 0-based layer):
  piece_l(t) = 0 while t <= l p, 1 while l p < t <= (l + 1) p, 0.1 after   (tf piecewise_constant: x <= boundary)
  bg(t)      = min(0.9 + 0.1 sqrt(1 - r), 10 r), r = (t mod p) / p          (a ramp over the first 10% of a phase)
  gate_l(t)  = [piece_l(t) = 1]       the layer whose transfer losses count at step t (get_layerwise_gate)
  lr_l(t)    = 3 bg(t) piece_l(t)     the learning-rate multiplier of layer l (lamb_optimizer.py); everything
                                      outside the encoder's layers gets 0 (frozen)
bg(t) = 0 at every phase start, so at t = l p no layer trains and LAMB's moments of every layer are reset.

`Transfer` is the `Distiller` (bertjax.model.distill) whose student runs its whole Pretrainer (MLM and sentence
logits: pre-training distillation trains NSP too) without dropout (the reference builds the student with
is_training=False whenever a teacher is configured), and, with `layers`, returns both networks' per-layer hidden
states, masked pre-softmax attention scores and the teacher's embedding output, plus `transfer_gate` [L] at the
batch's `step` (every layer on when the batch has none: evaluation).
"""

import jax
import jax.numpy as jnp
from flax import linen as nn

from bertjax.model.distill import Distiller, _forward
from bertjax.model.layer import sown_by_layers


def pieces(step, steps_per_phase: int, num_layers: int):
  """[L] piecewise_constant(step, [l p, (l + 1) p], [0, 1, 0.1]) of each layer l."""
  start = jnp.arange(num_layers) * steps_per_phase
  return jnp.where(step <= start, 0.0, jnp.where(step <= start + steps_per_phase, 1.0, 0.1))


def background(step, steps_per_phase: int):
  """distill_util.get_background_lr: min(poly(1 -> 0.9, power 0.5), linear 0 -> 10) over the step within its
  phase (1 with phases of one step)."""
  if steps_per_phase <= 1:
    return jnp.float32(1.0)
  r = (step % steps_per_phase) / steps_per_phase
  return jnp.minimum(0.9 + 0.1 * jnp.sqrt(1.0 - r), 10.0 * r).astype(jnp.float32)


def loss_gates(step, steps_per_phase: int, num_layers: int):
  """[L] 1 for the layer whose transfer losses count at `step`, else 0."""
  return (pieces(step, steps_per_phase, num_layers) > 0.5).astype(jnp.float32)


def lr_multipliers(step, steps_per_phase: int, num_layers: int):
  """[L] the learning-rate multiplier of each layer at `step`: 3 bg piece (active 3 bg, finished 0.3 bg,
  later 0)."""
  return 3.0 * background(step, steps_per_phase) * pieces(step, steps_per_phase, num_layers)


class Transfer(Distiller):
  """Student + frozen teacher for progressive knowledge transfer (`layers`) and pre-training distillation."""

  layers: bool = False  # every layer's outputs and the phase gate (progressive knowledge transfer)
  steps_per_phase: int = 1
  # The teacher's mean and variance over every layer at once (the reference code) or layer by layer (the paper).
  all_layer_statistics: bool = True

  @property
  def sentence_head(self) -> bool:
    return self.student_model.sentence_head

  def train_flops_per_token(self, seq_len: int, max_predictions: int, wso_positions: int = 0) -> float:
    """The student's training FLOPs per token plus the teacher's forward pass."""
    teacher = self.teacher_model.train_flops_per_token(seq_len, max_predictions) / 3.0
    return self.student_model.train_flops_per_token(seq_len, max_predictions, wso_positions) + teacher

  @nn.compact
  def __call__(self, batch):
    student_params, teacher_params = self.network_params(batch)
    mutable = ["intermediates"] if self.layers else False
    out = self.student_model.clone(deterministic=True, parent=None).apply(
        {"params": student_params}, batch, mutable=mutable)
    t_out = self.teacher_model.clone(deterministic=True, parent=None).apply(
        {"params": jax.lax.stop_gradient(teacher_params)}, batch, method=_forward, mutable=mutable)
    (out, s_sown), ((t_emb, _, t_logits), t_sown) = (out, t_out) if self.layers else ((out, None), (t_out, None))
    out = dict(out, kd_masked_student_logits=out["mlm_logits"] / self.temperature,
               kd_masked_teacher_logits=jax.lax.stop_gradient(t_logits) / self.temperature,
               kd_scale=jnp.float32(self.temperature**2))
    if self.layers:
      sg = jax.lax.stop_gradient
      num_layers = self.student_model.cfg.num_layers
      step = batch.get("step")
      out.update(
          student_layers=sown_by_layers(s_sown, "hidden"), teacher_layers=sg(sown_by_layers(t_sown, "hidden")),
          teacher_embedding=sg(t_emb), student_scores=sown_by_layers(s_sown, "attention_scores"),
          teacher_scores=sg(sown_by_layers(t_sown, "attention_scores")),
          all_layer_statistics=self.all_layer_statistics, transfer_gate=(jnp.ones(num_layers) if step is None
                         else loss_gates(step[0], self.steps_per_phase, num_layers)))
    return out
