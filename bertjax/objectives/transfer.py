"""Progressive knowledge transfer's losses (MobileBERT; google-research mobilebert run_pretraining.py), scored on a
bertjax.model.transfer.Transfer's outputs. Each is a sum over the layers of gate_l x the layer's term (the gate:
the phase's active layer; every layer at evaluation); the config weighs them by the reference's factors / L
(configs/mobilebert.py:transfer). As the reference, every term is a mean over all rows and positions, padding
included; a row's share is kept as a sum over rows with the row count as the denominator, so gradient
accumulation gives the large-batch value.

transfer_hidden     feature-map transfer: mean squared error of the affine-free LayerNorms (eps 1e-12, contrib
                    layer_norm's) of the teacher's and the student's layer outputs.
transfer_attention  attention transfer: sum over keys of -softmax(teacher scores) log_softmax(student scores),
                    averaged over rows, heads and queries (the reference's "kl_divergence", a cross-entropy: KL
                    plus the teacher's entropy, the same gradient). Scores are scaled and masked, pre-softmax.
                    The reference masks padded keys with a soft -6; bertjax's mask (transformers') gives them 0.
transfer_mean       mean transfer: mean of (mean_H teacher - mean_H student)^2.
transfer_variance   variance transfer: mean of |var_H teacher - var_H student|.

Teacher statistics (`statistics` output of the model, from `transfer.teacher_statistics`): the reference takes
the teacher's mean and variance of *every* layer at once (`teacher_hiddens`, the embedding output and all L
layers stacked, broadcast against the one student layer) -- the default here, as the code ran; `per_layer`
takes layer l's own, as the paper describes.
"""

import types

import jax
import jax.numpy as jnp

from bertjax.core.metrics import Mean

LN_EPS = 1e-12  # tf.contrib.layers.layer_norm's variance_epsilon


def _rows(batch):
  return batch["example_weight"].astype(jnp.float32)


def _count(batch):
  return _rows(batch).sum()


def _gated(per_layer_row, outputs, batch, name):
  """(sum over rows of sum_l gate_l x the [L, B] per-layer row means, metrics)."""
  total = (outputs["transfer_gate"][:, None] * per_layer_row * _rows(batch)[None]).sum()
  return total, {f"{name}_loss": Mean(total, _rows(batch).sum())}


def affine_free_ln(x):
  """LayerNorm over the last axis without scale or offset."""
  x = x.astype(jnp.float32)
  mean = x.mean(-1, keepdims=True)
  var = jnp.square(x - mean).mean(-1, keepdims=True)
  return (x - mean) * jax.lax.rsqrt(var + LN_EPS)


def _hidden(outputs, batch):
  diff = affine_free_ln(outputs["teacher_layers"]) - affine_free_ln(outputs["student_layers"])  # [L, B, S, H]
  return _gated(jnp.square(diff).mean((-2, -1)), outputs, batch, "transfer_hidden")


def _attention(outputs, batch):
  t = jax.nn.softmax(outputs["teacher_scores"].astype(jnp.float32), axis=-1)  # [L, B, heads, S, S]
  log_s = jax.nn.log_softmax(outputs["student_scores"].astype(jnp.float32), axis=-1)
  ce = -(t * log_s).sum(-1).mean((-2, -1))  # [L, B]: summed over keys, averaged over heads and queries
  return _gated(ce, outputs, batch, "transfer_attention")


def _moments(x):
  x = x.astype(jnp.float32)
  mean = x.mean(-1, keepdims=True)
  return mean, jnp.square(x - mean).mean(-1, keepdims=True)


def teacher_moments(outputs):
  """The teacher's (mean, variance) over the hidden axis that each student layer is compared with: [L, B, S, 1]
  per layer, or with `all_layer_statistics` [1, L + 1, B, S, 1] of the embedding output and every layer."""
  if outputs.get("all_layer_statistics", True):
    stacked = jnp.concatenate([outputs["teacher_embedding"][None], outputs["teacher_layers"]], axis=0)
    mean, var = _moments(stacked)
    return mean[None], var[None]
  return _moments(outputs["teacher_layers"])


def _student_moments(outputs, teacher_mean):
  mean, var = _moments(outputs["student_layers"])  # [L, B, S, 1]
  if teacher_mean.ndim == 5:  # against every teacher layer: [L, 1, B, S, 1]
    mean, var = mean[:, None], var[:, None]
  return mean, var


def _reduce(x):
  """[L, (K,) B, S, 1] -> [L, B]: the mean over everything but the layer and the row."""
  return x.mean(axis=(1, 3, 4)) if x.ndim == 5 else x.mean(axis=(2, 3))


def _mean(outputs, batch):
  t_mean, _ = teacher_moments(outputs)
  s_mean, _ = _student_moments(outputs, t_mean)
  return _gated(_reduce(jnp.square(t_mean - s_mean)), outputs, batch, "transfer_mean")


def _variance(outputs, batch):
  t_mean, t_var = teacher_moments(outputs)
  _, s_var = _student_moments(outputs, t_mean)
  return _gated(_reduce(jnp.abs(t_var - s_var)), outputs, batch, "transfer_variance")


hidden = types.SimpleNamespace(loss=_hidden, count=_count)
attention = types.SimpleNamespace(loss=_attention, count=_count)
mean = types.SimpleNamespace(loss=_mean, count=_count)
variance = types.SimpleNamespace(loss=_variance, count=_count)
OBJECTIVES = ("transfer_hidden", "transfer_attention", "transfer_mean", "transfer_variance")
