"""Optimizers: AdamW or ALBERT's LAMB, the reference schedules, decay mask, clipping.

`make(optimizer_config, schedule(kind, peak, warmup, total))` is the one factory: pretraining passes its
config's `optimizer` section and `lr_schedule(config)` (phases included), fine-tuning its own section
and step counts.

Schedules (`optimizer.schedule`), t the step (0-based, the step the rate is used for), w warmup, T total:
  linear   BERT / ALBERT `optimization.py`: peak * t / w while t < w, then peak * (1 - t / T)
           (polynomial decay over the *whole* run, power 1; warmup overrides its start).
  electra  ELECTRA `model/optimization.py`: peak * (1 - t / T) * min(1, t / w) (warmup multiplies).
  cosine   peak * t / w, then peak * (1 + cos(pi * (t - w) / (T - w))) / 2.
  linear_after_warmup  fairseq's polynomial_decay (RoBERTa) and transformers' get_linear_schedule_with_warmup:
           peak * t / w, then peak * (T - t) / (T - w) (the decay spans only the steps after warmup).
  poly_sqrt  NVIDIA DeepLearningExamples BERT `schedulers.py` PolyWarmUpScheduler (degree 0.5; their LAMB
           recipe): peak * t / w while t < w, then peak * (1 - t / T) ** 0.5 (decay over the whole run).
  constant peak * t / w while t < w, then peak (MobileBERT's progressive transfer: end_lr_rate 1.0).
  wsd      the trapezoidal warmup-stable-decay schedule with the "1-sqrt" cooldown (Hägele et al. 2024, "Scaling
           Laws and Compute-Optimal Training Beyond Fixed Training Durations", §3; ModernBERT, Warner et al. 2024,
           §2.2.2): peak * t / w, then peak until the last d = round(optimizer.decay_fraction * T) steps, then
           peak * (1 - sqrt((t - (T - d)) / d)).

StableAdamW (Wortsman et al. 2023, "Stable and low-precision training for large-scale vision-language models",
Algorithm 2; ModernBERT trains with optimi's `StableAdamW`) is AdamW whose learning rate is divided, per tensor and
per step, by max(1, RMS) with RMS = sqrt(mean(g^2 / max(v_hat, eps^2))) (v_hat the bias-corrected second moment
after this step's update): Adafactor's update clipping, which replaces gradient clipping. The weight decay is
scaled by the same factor, as in the reference. Per tensor means per original tensor: one RMS per layer of a
scanned stack, as LAMB's trust ratio.

Two switches say which published rule an optimizer follows (each recipe config sets both and names its source):
  optimizer.bias_correction  True: Adam's moments divided by 1 - b^t, update m_hat / (sqrt(v_hat) + eps)
           (torch / transformers AdamW, NVIDIA's LAMB, fairseq's adam up to where eps sits: docs/recipes.md);
           False: m / (sqrt(v) + eps) from the raw moments (google-research/bert and electra
           AdamWeightDecayOptimizer, ALBERT's LAMB).
  optimizer.decay_mask  bert: no weight decay on biases and LayerNorm (BERT's exclude_from_weight_decay
           ["LayerNorm", "layer_norm", "bias"]); all: every parameter (fairseq's adam: RoBERTa, SpanBERT).
Weight decay is decoupled (added to the update, times the learning rate) in every rule.

AdamW with bias correction is optax's adamw. LAMB is google-research/albert `lamb_optimizer.py` (no bias
correction) or NVIDIA's (apex FusedLAMB, with it): Adam's update plus decoupled weight decay, scaled by the
trust ratio ||w|| / ||update|| -- except for the parameters excluded from weight decay, which both references
also exclude from layer adaptation. The trust ratio is taken per original tensor: per layer of a scanned
`[layers, ...]` stack and per group of ALBERT's shared blocks, as the reference sees them.

The fused update (`make`'s default; `fused=False` builds the plain optax chain, which the tests hold it to bit for
bit) runs the same operations in fewer passes over memory. XLA:CPU (jaxlib 0.10) writes out every intermediate that
two loops read unless its op is cheap (a divide is not), and emits no multi-output loop fusion by default, so every
array the update writes is one loop. The chain wrote three such intermediates per parameter tensor: the clipped
gradient (optax.clip_by_global_norm's divide, read by both moments), LAMB's copies of the parameter and update in
optax's safe_norm, and StableAdamW's bias-corrected v (read by the RMS and the update). The fused path computes
each where it is read: clipping inside the moments' stage (`scale_by_adam_clipped`), each moment dividing by its
own copy of the norm (a scalar optimization barrier keeps XLA from merging the two divides); `trust_ratio_once`;
StableAdamW's RMS on its own copies of the step count and gradients. Per tensor that leaves one loop per moment and
one for the new parameter (bias correction, weight decay, trust ratio or RMS, learning rate and the parameter add
in it), and the reductions. The train step hands the update the global norm it logs (`global_norm`), so clipping
reads the gradients no second time. Same state tree as the chain (checkpoints load either way). Figures:
docs/cpu.md, "The optimizer update".
"""

from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from bertjax.core import config as config_lib, saved as saved_config
from bertjax.core.config import check
from bertjax.model.layer import is_stacked

_NO_DECAY = ("bias", "scale")  # LayerNorm scale/bias and every bias: BERT's ["LayerNorm", "layer_norm", "bias"]
SCHEDULES = ("linear", "linear_after_warmup", "electra", "cosine", "poly_sqrt", "wsd", "constant")
OPTIMIZERS = ("adamw", "lamb", "stableadamw")
DECAY_FRACTION = 0.2  # wsd's default cooldown share: Hägele et al. 2024 find 20% matches cosine
DECAY_MASKS = ("bert", "all")


def schedule(kind: str, peak: float, warmup: int, total: int, decay_fraction: float = DECAY_FRACTION) -> optax.Schedule:
  """The learning rate at each step (see the module docstring for the formulas and their sources);
  `decay_fraction`: wsd's share of the steps that decay."""
  if kind == "wsd":
    return wsd_schedule(peak, warmup, total, decay_fraction)
  if kind == "constant":
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup), optax.constant_schedule(peak)], [warmup])
  if kind == "cosine":
    return optax.warmup_cosine_decay_schedule(0.0, peak, warmup, total, 0.0)
  if kind == "linear_after_warmup":
    return optax.join_schedules(
        [optax.linear_schedule(0.0, peak, warmup), optax.linear_schedule(peak, 0.0, total - warmup)], [warmup])
  if kind == "poly_sqrt":
    return lambda t: peak * jnp.where(t < warmup, t / max(warmup, 1), jnp.sqrt(jnp.maximum(0.0, 1 - t / total)))
  if kind == "electra":
    decay = optax.polynomial_schedule(peak, 0.0, 1.0, total)
    return lambda t: decay(t) * (jnp.minimum(1.0, t / warmup) if warmup else 1.0)
  # linear: after warmup the rate is already peak * (1 - w / T), on the line that reaches 0 at T.
  return optax.join_schedules(
      [optax.linear_schedule(0.0, peak, warmup), optax.linear_schedule(peak * (1 - warmup / total), 0.0, total - warmup)],
      [warmup])


def wsd_schedule(peak: float, warmup: int, total: int, decay_fraction: float) -> optax.Schedule:
  """Warmup (linear from 0), stable at peak, then the 1-sqrt cooldown to 0 over the last decay_fraction of
  `total` steps (at least one step; the warmup is never cut short by it)."""
  decay = min(max(1, int(round(decay_fraction * total))), total - warmup)
  stable = total - warmup - decay
  cooldown = lambda t: peak * (1 - jnp.sqrt(jnp.clip(t / decay, 0.0, 1.0)))
  pieces = [optax.linear_schedule(0.0, peak, warmup), optax.constant_schedule(peak), cooldown]
  return optax.join_schedules(pieces, [warmup, warmup + stable])


def lr_schedule(config) -> optax.Schedule:
  """The run's learning rate at each step: optimizer.schedule from 0 to learning_rate over the warmup, down to
  0 at total_steps; a phase with its own learning_rate runs that schedule over its own steps instead."""
  kind, fraction = config.optimizer.schedule, config.optimizer.get("decay_fraction", DECAY_FRACTION)
  run = schedule(kind, config.learning_rate, config_lib.warmup_steps(config), config.total_steps, fraction)
  plan = config_lib.phases(config)
  if all(not p.learning_rate for p in plan):
    return run
  pieces = [schedule(kind, p.learning_rate, p.warmup_steps, p.steps, fraction)
            if p.learning_rate else (lambda t, s=p.start: run(t + s)) for p in plan]
  return optax.join_schedules(pieces, [p.start for p in plan[1:]])


def validate(config):
  """Checks config.optimizer (name and schedule); raises UserError with the fix on the first problem."""
  o = config.optimizer
  check(o.name in OPTIMIZERS, f"optimizer.name={o.name!r}; use {', '.join(OPTIMIZERS)}")
  check(o.schedule in SCHEDULES, f"optimizer.schedule={o.schedule!r}; use one of {', '.join(SCHEDULES)}")
  check(_decay_kind(o) in DECAY_MASKS, f"optimizer.decay_mask={_decay_kind(o)!r}; use bert or all")
  check(isinstance(_bias_correction(o), bool), f"optimizer.bias_correction={_bias_correction(o)!r}; use True or False")
  fraction = o.get("decay_fraction", DECAY_FRACTION)
  check(0 < fraction <= 1, f"optimizer.decay_fraction={fraction} must be in (0, 1]")


def _bias_correction(o) -> bool:
  # A section written before the switch existed: the rule it ran (adamw corrected, lamb not; saved.PREDATED).
  return o.get("bias_correction", saved_config.PREDATED[("optimizer", "bias_correction")](o))


def _decay_kind(o) -> str:
  return o.get("decay_mask", saved_config.PREDATED[("optimizer", "decay_mask")](o))


def decay_mask(params):
  """True for the parameters weight decay (and LAMB's layer adaptation) applies to: not biases, not
  LayerNorm."""

  def keep(path, _):  # the parameter's name: its path's last key (a split leaf's parts end in a layer index)
    return next((k.key for k in reversed(path) if hasattr(k, "key")), None) not in _NO_DECAY

  return jax.tree_util.tree_map_with_path(keep, params)


def decay_everything(params):
  """fairseq's mask (optimizer.decay_mask=all): weight decay on every parameter."""
  return jax.tree.map(lambda _: True, params)


def decay_mask_fn(kind: str):
  """The mask function of optimizer.decay_mask: bert -> decay_mask, all -> decay_everything."""
  return {"bert": decay_mask, "all": decay_everything}[kind]


def stacked_mask(params):
  """True for parameters that hold several original tensors along their leading axis (scanned layers,
  ALBERT's shared groups)."""
  return jax.tree_util.tree_map_with_path(lambda path, _: is_stacked(path), params)


class _MomentsState(NamedTuple):
  mu: optax.Updates
  nu: optax.Updates


def scale_by_adam_moments(b1: float, b2: float, eps: float) -> optax.GradientTransformation:
  """m / (sqrt(v) + eps) from Adam's moments *without* bias correction, as ALBERT's LAMB and BERT's
  AdamWeightDecayOptimizer (optax's scale_by_adam always corrects, and at step 1 that changes the update's
  size against the weight decay)."""

  def init(params):
    zeros = lambda: jax.tree.map(jnp.zeros_like, params)
    return _MomentsState(zeros(), zeros())

  def update(updates, state, params=None):
    del params
    mu = optax.tree.update_moment(updates, state.mu, b1, 1)
    nu = optax.tree.update_moment_per_elem_norm(updates, state.nu, b2, 2)
    return jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu), _MomentsState(mu, nu)

  return optax.GradientTransformation(init, update)


def clipped(grads, max_norm: float, norm, copies: int = 1) -> tuple:
  """`copies` trees of `grads` clipped to global norm `max_norm` as optax.clip_by_global_norm clips them (the same
  select and arithmetic), given their global `norm`; max_norm 0: the gradients as they are. Each copy divides by
  its own copy of the norm (a scalar optimization barrier, free), so XLA fuses each copy's divide into the loop
  that reads it instead of writing one clipped tree out for all of them (module docstring)."""
  if not max_norm:
    return (grads,) * copies
  trigger = jnp.squeeze(norm < max_norm)
  out = []
  for i in range(copies):
    n = norm if i == 0 else jax.lax.optimization_barrier(norm)
    out.append(jax.tree.map(lambda t, n=n: jax.lax.select(trigger, t, (t / n.astype(t.dtype)) * max_norm), grads))
  return tuple(out)


def scale_by_adam_clipped(b1: float, b2: float, eps: float, bias_correction: bool,
                          clip_norm: float) -> optax.GradientTransformationExtraArgs:
  """Global-norm clipping (clip_norm 0: none) then Adam's moments and update, with the state and arithmetic of
  optax.scale_by_adam (bias_correction) or scale_by_adam_moments, op for op: `make`'s fused path. Each moment reads
  the gradients through its own `clipped` copy, so the clipped gradients are never written out. update takes
  `global_norm=` (the gradients' global norm, when the caller has it: the train step logs it) to skip computing it."""

  def update(grads, state, params=None, *, global_norm=None, **extra):
    del params, extra
    norm = optax.tree.norm(grads) if clip_norm and global_norm is None else global_norm
    first, second = clipped(grads, clip_norm, norm, 2)
    mu = optax.tree.update_moment(first, state.mu, b1, 1)
    nu = optax.tree.update_moment_per_elem_norm(second, state.nu, b2, 2)
    if not bias_correction:
      return jax.tree.map(lambda m, v: m / (jnp.sqrt(v) + eps), mu, nu), _MomentsState(mu, nu)
    count = optax.safe_increment(state.count)
    mu_hat, nu_hat = optax.tree.bias_correction(mu, b1, count), optax.tree.bias_correction(nu, b2, count)
    updates = jax.tree.map(lambda m, v: m / (jnp.sqrt(v + 0.0) + eps), mu_hat, nu_hat)  # optax's eps_root 0.0
    return updates, optax.ScaleByAdamState(count=count, mu=mu, nu=nu)

  return optax.GradientTransformationExtraArgs(_adam(b1, b2, eps, bias_correction).init, update)


def per_tensor_trust_ratio(fused: bool = False) -> optax.GradientTransformation:
  """optax.scale_by_trust_ratio applied to each original tensor: a stacked leaf gets one ratio per
  slice of its leading axis (vmapped), any other leaf one ratio. `fused`: `trust_ratio_once` instead."""
  ratio = optax.scale_by_trust_ratio()

  def one(u, p):
    return trust_ratio_once(u, p) if fused else ratio.update(u, optax.EmptyState(), p)[0]

  def update(updates, state, params):
    per = lambda u, p, stacked: jax.vmap(one)(u, p) if stacked else one(u, p)
    return jax.tree.map(per, updates, params, stacked_mask(params)), state

  return optax.GradientTransformation(lambda _: optax.EmptyState(), update)


def trust_ratio_once(u, p):
  """optax.scale_by_trust_ratio's update with its defaults (min_norm 0, coefficient 1, eps 0) on one tensor, each
  norm taken once: its safe_norm takes a second norm of a copy with zero-norm tensors replaced by ones (for
  gradients through the norm, which an optimizer step never takes), one more write, read and reduction of the
  tensor. The ratio is the same: the norm where it is nonzero, and 1 where either norm is 0."""
  p_norm, u_norm = jnp.linalg.norm(p), jnp.linalg.norm(u)
  ratio = 1.0 * p_norm / (u_norm + 0.0)
  return u * jnp.where(jnp.logical_or(p_norm == 0.0, u_norm == 0.0), jnp.array(1.0, dtype=p.dtype), ratio)


def _adam(b1: float, b2: float, eps: float, bias_correction: bool) -> optax.GradientTransformation:
  return optax.scale_by_adam(b1, b2, eps) if bias_correction else scale_by_adam_moments(b1, b2, eps)


def lamb(learning_rate, b1: float, b2: float, eps: float, weight_decay: float, bias_correction: bool = False,
         mask=decay_mask, moments=None) -> optax.GradientTransformation:
  """LAMB from optax's building blocks: ALBERT's (google-research/albert lamb_optimizer.py; no bias
  correction) or, with bias_correction, NVIDIA's (apex multi_tensor_lamb.cu: m / (1 - b1^t), v / (1 - b2^t)).
  `moments`: the Adam stage (None: optax's or scale_by_adam_moments; make's fused path: scale_by_adam_clipped)."""
  return optax.chain(
      moments or _adam(b1, b2, eps, bias_correction),
      optax.add_decayed_weights(weight_decay, mask=mask),
      # ALBERT: exclude_from_layer_adaptation defaults to exclude_from_weight_decay; apex: the trust ratio only
      # where the parameter group's weight decay is nonzero (use_nvlamb False).
      optax.masked(per_tensor_trust_ratio(fused=moments is not None), mask),
      optax.scale_by_learning_rate(learning_rate),
  )


def adam_weight_decay(learning_rate, b1: float, b2: float, eps: float, weight_decay: float,
                      mask=decay_mask, moments=None) -> optax.GradientTransformation:
  """google-research/bert optimization.py AdamWeightDecayOptimizer (also ELECTRA's): update = m / (sqrt(v) +
  eps) from moments without bias correction, plus weight_decay x w where the mask says, times the rate; with
  `moments` (an Adam stage with optax.adamw's state), optax.adamw's chain around it."""
  return optax.chain(moments or scale_by_adam_moments(b1, b2, eps), optax.add_decayed_weights(weight_decay, mask=mask),
                     optax.scale_by_learning_rate(learning_rate))


def per_tensor(fn, stacked: bool):
  """`fn` (arrays -> array) on each original tensor: vmapped over the leading axis of a stacked leaf."""
  return jax.vmap(fn) if stacked else fn


def stable_adamw(learning_rate, b1: float, b2: float, eps: float, weight_decay: float,
                 mask=decay_mask, fused: bool = False) -> optax.GradientTransformation:
  """StableAdamW (Wortsman et al. 2023, Algorithm 2; optimi's StableAdamW, which ModernBERT trains with): optax's
  Adam moments and decoupled weight decay, the sum divided per tensor by max(1, RMS), RMS = sqrt(mean(g^2 /
  max(v_hat, eps^2))), then scaled by the learning rate. Its state is Adam's (no extra buffer); always
  bias-corrected, as optimi's. `fused`: the RMS reads its own copy of the step count (a scalar optimization
  barrier), so its v_hat is a divide of its own that fuses into the RMS's reduction, not one that the update's
  loop shares and XLA:CPU therefore writes out (module docstring); the same arithmetic."""
  inner = optax.chain(optax.scale_by_adam(b1, b2, eps), optax.add_decayed_weights(weight_decay, mask=mask))

  def update(grads, state, params):
    updates, state = inner.update(grads, state, params)
    adam = state[0]
    count, rms_grads = jax.lax.optimization_barrier((adam.count, grads)) if fused else (adam.count, grads)
    nu_hat = optax.tree.bias_correction(adam.nu, b2, count)

    def clip(u, g, v, stacked):
      def one(u, g, v):
        rms = jnp.sqrt(jnp.mean(jnp.square(g.astype(jnp.float32)) / jnp.maximum(v, eps * eps)))
        return u / jnp.maximum(1.0, rms).astype(u.dtype)

      return per_tensor(one, stacked)(u, g, v)

    return jax.tree.map(clip, updates, rms_grads, nu_hat, stacked_mask(grads)), state

  return optax.chain(optax.GradientTransformation(inner.init, update), optax.scale_by_learning_rate(learning_rate))


def make(o, learning_rate: optax.ScalarOrSchedule, fused: bool = True) -> optax.GradientTransformation:
  """Global-norm clipping then AdamW, LAMB or StableAdamW, from an `optimizer` config section (name, b1, b2,
  eps, weight_decay, clip_norm, bias_correction, decay_mask) and a learning rate or schedule. `fused` (the
  default): the same operations in fewer passes over memory (module docstring; update takes `global_norm=`, the
  gradients' global norm where the caller has it); False: the plain optax chain. Both have the same state."""
  mask, corrected = decay_mask_fn(_decay_kind(o)), _bias_correction(o)
  if not fused:
    return _reference(o, learning_rate, mask, corrected)
  if o.name == "stableadamw":  # no clipping in its recipe: optax's clipping in front, where a config sets it
    opt = stable_adamw(learning_rate, o.b1, o.b2, o.eps, o.weight_decay, mask, fused=True)
    return optax.chain(optax.clip_by_global_norm(o.clip_norm), opt) if o.clip_norm else opt
  moments = scale_by_adam_clipped(o.b1, o.b2, o.eps, corrected, o.clip_norm)
  if o.name == "lamb":
    opt = lamb(learning_rate, o.b1, o.b2, o.eps, o.weight_decay, corrected, mask, moments)
  else:  # optax.adamw's chain, or BERT's AdamWeightDecayOptimizer: the moments' stage decides
    opt = adam_weight_decay(learning_rate, o.b1, o.b2, o.eps, o.weight_decay, mask, moments)
  # optax.identity where the reference clips (its state, EmptyState, is clip_by_global_norm's): same state tree.
  return optax.chain(optax.identity(), opt) if o.clip_norm else opt


def _reference(o, learning_rate, mask, corrected: bool) -> optax.GradientTransformation:
  """make's optimizer as the plain optax chain: optax.clip_by_global_norm, then the optimizer."""
  if o.name == "lamb":
    opt = lamb(learning_rate, o.b1, o.b2, o.eps, o.weight_decay, corrected, mask)
  elif o.name == "stableadamw":
    opt = stable_adamw(learning_rate, o.b1, o.b2, o.eps, o.weight_decay, mask)
  elif corrected:
    opt = optax.adamw(learning_rate, b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay, mask=mask)
  else:
    opt = adam_weight_decay(learning_rate, o.b1, o.b2, o.eps, o.weight_decay, mask)
  return optax.chain(optax.clip_by_global_norm(o.clip_norm), opt) if o.clip_norm else opt
