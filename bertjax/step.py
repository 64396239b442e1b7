"""The pure train and eval steps: masking on device, model, objectives, optax update (jitted by the loop).

`train_step(state, batch, ...) -> (state, metrics)` is a module-level function with everything static
bound by `functools.partial`; the loop jits it once with explicit shardings and donated state. All
randomness is `fold_in(seed, step)`, so a step is a pure function of (state, batch).
"""

import dataclasses
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax
from flax import linen as nn

from bertjax import masking
from bertjax.objectives import total_loss

RNG_MASK, RNG_DROPOUT, RNG_SAMPLE, RNG_EVAL = 0, 1, 2, 3


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any


@dataclasses.dataclass(frozen=True)
class StepConfig:
  """What the step needs besides model and optimizer (hashable: it is bound statically)."""

  seed: int
  masking: masking.MaskingConfig
  special_ids: tuple  # never masked
  mask_id: int
  vocab_size: int
  objectives: tuple  # ((name, weight), ...)
  grad_accum_steps: int = 1


def apply_masking(rng, batch, cfg: StepConfig):
  """The batch with MLM masking applied on device (original ids kept for labels and RTD)."""
  masked = masking.mask_batch(rng, batch["input_ids"], batch["word_start"], special_ids=cfg.special_ids,
                              mask_id=cfg.mask_id, vocab_size=cfg.vocab_size, cfg=cfg.masking)
  out = dict(batch, original_ids=batch["input_ids"], **masked)
  out["mlm_weights"] = masked["mlm_weights"] * batch["example_weight"][:, None]  # padded eval rows
  return out


def _loss_fn(params, batch, rng, model, cfg: StepConfig, deterministic: bool):
  r_mask, r_drop, r_sample = (jax.random.fold_in(rng, i) for i in (RNG_MASK, RNG_DROPOUT, RNG_SAMPLE))
  batch = apply_masking(r_mask, batch, cfg)
  outputs = model.clone(deterministic=deterministic).apply(
      {"params": params}, batch, rngs={"dropout": r_drop, "sample": r_sample})
  return total_loss(dict(cfg.objectives), outputs, batch)


def _add(a, b):
  return jax.tree.map(jnp.add, a, b)


def train_step(state: TrainState, batch, *, model: nn.Module, tx: optax.GradientTransformation, cfg: StepConfig):
  """One optimizer step on a global batch, accumulating gradients over `grad_accum_steps` microbatches."""
  rng = jax.random.fold_in(jax.random.key(cfg.seed), state.step)
  grad_fn = jax.value_and_grad(_loss_fn, has_aux=True)
  k = cfg.grad_accum_steps

  def micro(i, mb):
    (_, metrics), grads = grad_fn(state.params, mb, jax.random.fold_in(rng, i), model, cfg, False)
    return grads, metrics

  if k == 1:
    grads, metrics = micro(0, batch)
  else:
    # A scan over microbatches: one gradient buffer, unlike optax.MultiSteps' extra copy across steps.
    mbs = jax.tree.map(lambda x: x.reshape(k, x.shape[0] // k, *x.shape[1:]), batch)
    first = jax.tree.map(lambda x: x[0], mbs)
    zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(lambda: micro(0, first)))

    def body(acc, xs):
      i, mb = xs
      return _add(acc, micro(i, mb)), None

    (grads, metrics), _ = jax.lax.scan(body, zeros, (jnp.arange(k), mbs))
    grads = jax.tree.map(lambda g: g / k, grads)
  updates, opt_state = tx.update(grads, state.opt_state, state.params)
  params = optax.apply_updates(state.params, updates)
  metrics.update(
      grad_norm=(optax.global_norm(grads), 1.0),
      param_norm=(optax.global_norm(params), 1.0),
      update_norm=(optax.global_norm(updates), 1.0),
  )
  return TrainState(step=state.step + 1, params=params, opt_state=opt_state), metrics


def eval_step(params, batch, index, *, model: nn.Module, cfg: StepConfig):
  """Metric sums on one eval batch; its masks depend only on the batch index, so every eval of a run
  (and of runs with other seeds) scores the same masked positions."""
  rng = jax.random.fold_in(jax.random.key(RNG_EVAL), index)
  _, metrics = _loss_fn(params, batch, rng, model, cfg, True)
  return metrics
