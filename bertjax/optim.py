"""Optimizers from the config: AdamW or LAMB (optax), warmup + decay schedule, decay mask, clipping."""

import jax
import optax

_NO_DECAY = ("bias", "scale")  # LayerNorm scale/bias and every bias, as in BERT's AdamWeightDecay


def schedule(config) -> optax.Schedule:
  """Linear warmup to the peak learning rate, then linear (BERT/ALBERT) or cosine decay to 0."""
  peak, warmup, total = config.learning_rate, config.warmup_steps, config.total_steps
  if config.optimizer.schedule == "cosine":
    return optax.warmup_cosine_decay_schedule(0.0, peak, warmup, total, 0.0)
  return optax.join_schedules(
      [optax.linear_schedule(0.0, peak, warmup), optax.linear_schedule(peak, 0.0, total - warmup)], [warmup])


def decay_mask(params):
  """True for the parameters weight decay applies to: not biases, not LayerNorm."""

  def keep(path, _):
    return getattr(path[-1], "key", None) not in _NO_DECAY

  return jax.tree_util.tree_map_with_path(keep, params)


def make(config) -> optax.GradientTransformation:
  """The config's optimizer: global-norm clipping then AdamW or LAMB with the same decay mask."""
  o = config.optimizer
  make_opt = {"adamw": optax.adamw, "lamb": optax.lamb}[o.name]
  opt = make_opt(schedule(config), b1=o.b1, b2=o.b2, eps=o.eps, weight_decay=o.weight_decay, mask=decay_mask)
  return optax.chain(optax.clip_by_global_norm(o.clip_norm), opt) if o.clip_norm else opt
