"""Distillation objectives against a frozen teacher (bertjax.model.distill.Distiller's outputs).

distill_ce         DistilBERT's soft-target loss: KL(teacher || student) of the MLM distributions at
                   temperature T over every real (non-padding) token, times T^2 (Hinton et al.; distiller.py's
                   KLDivLoss(batchmean) over the attention mask, x T^2). KL, not cross-entropy: the same
                   gradient, and 0 at a perfect copy.
distill_ce_masked  the same KL over the masked slots only (distiller.py's --restrict_ce_to_mask).
distill_cos        DistilBERT's cosine loss: 1 - cos(student, teacher) of the final hidden states of every
                   real token.
distill_embedding  TinyBERT's embedding-layer loss: MSE between the student's embedding output (through the
                   learned projection when it is narrower) and the teacher's, per real token.
distill_hidden     TinyBERT's hidden-state loss: MSE between each student layer (projected when narrower) and
                   its mapped teacher layer (layer m <- teacher layer m x L_t / L_s), per real token, summed
                   over layers.
distill_attention  TinyBERT's attention loss: MSE between student and mapped teacher attention maps over real
                   query and key tokens, summed over layers and heads. TinyBERT compares the unnormalized
                   scores; here the probabilities the encoder sows (the scores are not kept). Needs equal
                   head counts.

TinyBERT (general_distill.py) takes torch's MSELoss mean over every element of [B, S, H], padding included;
here the mean is over H and the sum over real tokens, divided by their count, so padding never counts.
"""

import types

import jax
import jax.numpy as jnp

from bertjax.core.metrics import Mean


def _mlm_count(batch):
  return batch["mlm_weights"].sum()


def _token_count(batch):
  return (batch["groups"] > 0).sum().astype(jnp.float32)


def _log_softmax(x):
  return jax.nn.log_softmax(x.astype(jnp.float32), axis=-1)


def _kl(student, teacher, scale, w):
  """Sum over positions of w x KL(softmax(teacher) || softmax(student)) x scale."""
  log_s, log_t = _log_softmax(student), _log_softmax(teacher)
  kl = (jnp.exp(log_t) * (log_t - log_s)).sum(-1) * scale
  return (kl * w).sum()


def _ce(outputs, batch):
  w = (batch["groups"] > 0).astype(jnp.float32)
  total = _kl(outputs["kd_student_logits"], outputs["kd_teacher_logits"], outputs["kd_scale"], w)
  return total, {"distill_ce_loss": Mean(total, w.sum())}


def _ce_masked(outputs, batch):
  w = batch["mlm_weights"].astype(jnp.float32)
  total = _kl(outputs["kd_masked_student_logits"], outputs["kd_masked_teacher_logits"], outputs["kd_scale"], w)
  return total, {"distill_ce_masked_loss": Mean(total, w.sum())}


def _cos(outputs, batch):
  real = (batch["groups"] > 0).astype(jnp.float32)
  s, t = outputs["student_hidden"].astype(jnp.float32), outputs["teacher_hidden"].astype(jnp.float32)
  cos = (s * t).sum(-1) / jnp.maximum(jnp.linalg.norm(s, axis=-1) * jnp.linalg.norm(t, axis=-1), 1e-8)
  total = ((1.0 - cos) * real).sum()
  return total, {"distill_cos_loss": Mean(total, real.sum())}


def _embedding(outputs, batch):
  real = (batch["groups"] > 0).astype(jnp.float32)  # [B, S]
  diff = outputs["student_embedding"].astype(jnp.float32) - outputs["teacher_embedding"].astype(jnp.float32)
  total = ((diff * diff).mean(-1) * real).sum()
  return total, {"distill_embedding_loss": Mean(total, real.sum())}


def _hidden(outputs, batch):
  real = (batch["groups"] > 0).astype(jnp.float32)  # [B, S]
  diff = outputs["student_layers"].astype(jnp.float32) - outputs["teacher_layers"].astype(jnp.float32)
  total = ((diff * diff).mean(-1).sum(0) * real).sum()  # [L, B, S, H] -> per token, layers summed
  return total, {"distill_hidden_loss": Mean(total, real.sum())}


def _attention(outputs, batch):
  real = (batch["groups"] > 0).astype(jnp.float32)
  pair = real[:, None, :, None] * real[:, None, None, :]  # [B, 1, S, S]: real query and key
  diff = outputs["student_attention"] - outputs["teacher_attention"]  # [L, B, H, S, S]
  total = ((diff * diff * pair).sum(-1).sum(2).sum(0)).sum()  # keys, heads, layers; then query tokens
  return total, {"distill_attention_loss": Mean(total, real.sum())}


ce = types.SimpleNamespace(loss=_ce, count=_token_count)
ce_masked = types.SimpleNamespace(loss=_ce_masked, count=_mlm_count)
cos = types.SimpleNamespace(loss=_cos, count=_token_count)
embedding = types.SimpleNamespace(loss=_embedding, count=_token_count)
hidden = types.SimpleNamespace(loss=_hidden, count=_token_count)
attention = types.SimpleNamespace(loss=_attention, count=_token_count)
LAYER_OBJECTIVES = ("distill_hidden", "distill_attention")  # need every layer's outputs
PROJECTED_OBJECTIVES = ("distill_embedding", "distill_hidden")  # compare widths: projected when the student is narrower
