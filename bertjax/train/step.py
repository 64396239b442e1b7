"""The pure train and eval steps: masking on device, model, objectives, optax update (jitted by the loop).

`train_step(state, batch, ...) -> (state, metrics)` is a module-level function with everything static
bound by `functools.partial`; the loop jits it once with explicit shardings and donated state. All
randomness comes from named streams of (seed, step) (`stream_key`), so a step is a pure function of
(state, batch) and no two uses of randomness share a key.
"""

import dataclasses
import zlib
from typing import Any

import flax
import jax
import jax.numpy as jnp
import optax
from flax import linen as nn

from bertjax import objectives
from bertjax.core.metrics import Mean, Sum
from bertjax.model import unstacked
from bertjax.objectives import masking, plm, wklm

# Every random use in a step has its own stream; a stream's key is folded from (seed, step, the stream's
# name, microbatch index), so streams cannot collide by sharing a small integer (the masking key was once
# microbatch 0's dropout base key). Eval streams are separate names with a fixed seed: eval masks depend only
# on the eval batch index, the same for every run.
STREAMS = ("masking", "dropout", "sample", "eval/masking", "eval/sample")
EVAL_SEED = 0


def stream_key(seed: int, step, stream: str, index=0):
  """The key of the named random `stream` at (seed, step); `index` numbers microbatches."""
  if stream not in STREAMS:
    raise ValueError(f"unknown random stream {stream!r}; add it to STREAMS")
  key = jax.random.fold_in(jax.random.key(seed), step)
  return jax.random.fold_in(jax.random.fold_in(key, zlib.crc32(stream.encode())), index)


def model_rngs(seed: int, step, microbatch=0) -> dict:
  """The model's rng collections for one microbatch of a training step: dropout and ELECTRA sampling."""
  return {"dropout": stream_key(seed, step, "dropout", microbatch), "sample": stream_key(seed, step, "sample", microbatch)}


@flax.struct.dataclass
class TrainState:
  step: jax.Array
  params: Any
  opt_state: Any
  # A recurrent model's memory (XLNet's: each layer's inputs of the previous segments) in the model's own layout
  # (StepConfig.memory_axes says where each leaf holds the batch), all zeros when empty; None for every other model.
  # Checkpointed with the rest, so a resumed run continues its streams.
  memory: Any = None


@dataclasses.dataclass(frozen=True)
class StepConfig:
  """What the step needs besides model and optimizer (hashable: it is bound statically)."""

  seed: int
  masking: masking.MaskingConfig  # scheme, rates and the tokenizer's special ids
  objectives: tuple  # ((name, weight), ...)
  grad_accum_steps: int = 1
  # The steps whose metrics the loop logs (step number after the update): every `report_every`-th and those in
  # `report_at` (phase ends). Only they compute param_norm and update_norm, two passes over the parameters.
  report_every: int = 1
  report_at: tuple = ()
  # [vocab] corpus token counts for masking.replace_dist=unigram / masking.smoothing (None when unused): bound with
  # the config, so the compiled step holds them as a constant; left out of hashing and comparison.
  token_counts: Any = dataclasses.field(default=None, hash=False, compare=False)
  # Eval batches' masking when it differs from training's (masking.eval_mask_prob: ModernBERT trains at 30% and
  # evaluates at 15%); None: the training masking.
  eval_masking: Any = None
  wklm_mentions: int = 0  # WKLM's mention slots per example (0: no wklm objective)
  plm: Any = None  # XLNet's permutation LM (plm.PLMConfig): perm_mask and targets replace MLM masking
  memory_axes: tuple = ()  # the batch axis of each leaf of the state's memory (build.MemorySpec)


def reports(done, cfg: StepConfig):
  """Whether the step that ends with `done` steps taken is logged."""
  report = done % cfg.report_every == 0
  for end in cfg.report_at:
    report = report | (done == end)
  return report


def apply_masking(rng, batch, cfg: StepConfig, evaluation: bool = False):
  """The batch with MLM masking applied on device (original ids kept for labels and RTD); `evaluation`: with the
  eval masking (cfg.eval_masking, where set)."""
  if cfg.plm is not None:  # the targets and their order came with the batch; nothing is masked
    return dict(batch, **plm.inputs(batch, cfg.plm))
  scheme = cfg.eval_masking if evaluation and cfg.eval_masking is not None else cfg.masking
  boundaries = batch["unit_start"] if scheme.units else batch["word_start"]  # masking.units: ERNIE's units
  protect = wklm.protected(batch["mention"]) if cfg.wklm_mentions else None  # WKLM: no MLM mask on a mention
  if "node_first" in batch:  # tree rows (bertjax.data.trees): MLM over the leaves, never a node
    protect = (batch["node_first"] >= 0) | (False if protect is None else protect)
  masked = masking.mask_batch(rng, batch["input_ids"], boundaries, scheme, cfg.token_counts, protect)
  if cfg.wklm_mentions:
    masked.update(wklm.mention_slots(batch["mention"], cfg.wklm_mentions))
  out = dict(batch, original_ids=batch["input_ids"], **masked)
  for key in ("mlm_weights", "span_weights", "wso_weights", "wklm_weights"):  # padded eval rows weigh 0
    if key in out:
      out[key] = masked[key] * batch["example_weight"][:, None]
  for key in ("units_masked", "units_cut"):
    if key in out:
      out[key] = masked[key] * batch["example_weight"]
  return out


def training_batch(batch, step, cfg: StepConfig):
  """The masked batch that `train_step` trains on at `step` (also what a reference implementation is fed)."""
  return apply_masking(stream_key(cfg.seed, step, "masking"), batch, cfg)


def eval_batch(batch, index, cfg: StepConfig):
  """The masked batch that `eval_step` scores for eval batch `index` (the same in every run)."""
  return apply_masking(stream_key(EVAL_SEED, index, "eval/masking"), batch, cfg, evaluation=True)


def _memory_moved(memory, axes, to_front: bool):
  """The memory with each leaf's batch axis moved to the front (to_front) or back to where the model keeps it."""
  if memory is None:
    return None
  move = lambda x, a: jnp.moveaxis(x, a, 0) if to_front else jnp.moveaxis(x, 0, a)
  return jax.tree.unflatten(jax.tree.structure(memory), [move(x, a) for x, a in zip(jax.tree.leaves(memory), axes)])


def _loss_fn(params, batch, rngs, model, cfg: StepConfig, *, deterministic: bool, denominators=None):
  """Total loss and (metrics, the model's next memory or None) of an already masked batch (`denominators`: see
  objectives.total_loss). A model with memory takes `memory=` (batch["memory"], batch axes first, as microbatches
  split it) and returns outputs["memory"], and its outputs["cmem_loss"] (the compressed memory's reconstruction
  loss, which trains the compression function only) joins the loss."""
  batch = dict(batch)
  memory = _memory_moved(batch.pop("memory", None), cfg.memory_axes, to_front=False)
  extra = {} if memory is None else {"memory": memory}
  # A state split per layer (bertjax.model.unstacked) is stacked here, inside the step, where XLA folds the
  # unrolled layers' slices of the stack (and their gradients' concatenation) away.
  outputs = model.clone(deterministic=deterministic).apply({"params": unstacked.join(params)}, batch, rngs=rngs,
                                                          **extra)
  total, metrics = objectives.total_loss(dict(cfg.objectives), outputs, batch, denominators)
  if memory is not None and "cmem_loss" in outputs:  # a microbatch's share of the batch's
    cmem = outputs["cmem_loss"] / cfg.grad_accum_steps
    total = total + cmem
    metrics["cmem_loss"], metrics["loss"] = Mean(cmem, 1.0), Mean(metrics["loss"].total + cmem, 1.0)
  return total, (metrics, _memory_moved(outputs.get("memory"), cfg.memory_axes, to_front=True))


def _add(a, b):
  return jax.tree.map(jnp.add, a, b)


def _split(tree, k):
  return jax.tree.map(lambda x: x.reshape(k, x.shape[0] // k, *x.shape[1:]), tree)


def train_step(state: TrainState, batch, *, model: nn.Module, tx: optax.GradientTransformation, cfg: StepConfig):
  """One optimizer step on a global batch, accumulating gradients over `grad_accum_steps` microbatches.

  The whole batch is masked once and every microbatch's loss sums are divided by the whole batch's
  target counts, so accumulation gives the large-batch gradient (exactly, up to summation order).
  A non-finite loss or gradient norm skips the update (params and optimizer state unchanged) and
  reports `skipped` = 1.
  """
  batch = training_batch(batch, state.step, cfg)
  # The step each row trains at, for a model whose loss follows it (bertjax.model.transfer's phase gates); one
  # per row, so that microbatches split it as they split the rows. Every other model ignores it.
  batch["step"] = jnp.broadcast_to(state.step, batch["input_ids"].shape[:1])
  if state.memory is not None:  # row b's memory is its stream's past: it travels with the row, microbatches too
    batch = dict(batch, memory=_memory_moved(state.memory, cfg.memory_axes, to_front=True))
  denominators = objectives.counts(dict(cfg.objectives), batch)
  grad_fn = jax.value_and_grad(_loss_fn, has_aux=True)
  k = cfg.grad_accum_steps

  def micro(i, mb):
    (_, (metrics, memory)), grads = grad_fn(state.params, mb, model_rngs(cfg.seed, state.step, i), model, cfg,
                                            deterministic=False, denominators=denominators)
    return (grads, metrics), memory

  if k == 1:
    (grads, metrics), memory = micro(0, batch)
  else:
    # A scan over microbatches keeps one gradient buffer (optax.MultiSteps would keep another across steps).
    mbs = _split(batch, k)
    zeros = jax.tree.map(jnp.zeros_like, jax.eval_shape(lambda: micro(0, jax.tree.map(lambda x: x[0], mbs))[0]))

    def body(acc, xs):
      summed, memory = micro(*xs)
      return _add(acc, summed), memory

    (grads, metrics), memory = jax.lax.scan(body, zeros, (jnp.arange(k), mbs))
    memory = jax.tree.map(lambda x: x.reshape(-1, *x.shape[2:]), memory)  # the microbatches' rows, in order
    metrics["loss"] = Mean(metrics["loss"].total, 1.0)  # the microbatch losses add up to the batch loss
  grad_norm = optax.tree.norm(grads)
  finite = jnp.isfinite(metrics["loss"].total) & jnp.isfinite(grad_norm)
  # param_norm and update_norm only on steps that log (a cond runs one branch): two passes over the
  # parameters, ~3% of a BERT-base CPU step, for figures that would otherwise be averaged over unread steps.
  report = reports(state.step + 1, cfg)
  only_if_reported = lambda f: jax.lax.cond(report, f, lambda: jnp.float32(0.0))
  # Skip a non-finite step: keep the old params and optimizer state (the step counter still advances,
  # so the next step sees new data and masks rather than the same poisoned batch). A cond, not a select
  # between old and new state: the select is one more pass over params and optimizer state (~5% of a
  # BERT-base step on CPU).

  def apply_update(_):
    # The fused optimizers (optim.make) clip with the norm computed above instead of a second pass over grads.
    extra = {"global_norm": grad_norm} if isinstance(tx, optax.GradientTransformationExtraArgs) else {}
    updates, opt_state = tx.update(grads, state.opt_state, state.params, **extra)
    params = optax.apply_updates(state.params, updates)
    # The norm of the applied change, from new - old: the norm of `updates` itself would make XLA write
    # `updates` out once more per parameter (3% of a BERT-base CPU step).
    update_norm = only_if_reported(lambda: optax.tree.norm(jax.tree.map(jnp.subtract, params, state.params)))
    return params, opt_state, update_norm

  def skip_update(_):
    return state.params, state.opt_state, jnp.float32(0.0)  # no update: its norm is 0

  params, opt_state, update_norm = jax.lax.cond(finite, apply_update, skip_update, None)
  param_norm = only_if_reported(lambda: optax.tree.norm(params))
  counted = report.astype(jnp.float32)
  metrics.update(
      grad_norm=Mean(grad_norm, 1.0),
      param_norm=Mean(param_norm, counted),  # the value at the logged step, not a mean over the window
      update_norm=Mean(update_norm, counted),
      skipped=Sum(1.0 - finite.astype(jnp.float32)),
  )
  if memory is not None:  # a skipped step's memory may hold non-finite values: the streams keep their old one
    memory = _memory_moved(memory, cfg.memory_axes, to_front=False)
    memory = jax.tree.map(lambda new, old: jnp.where(finite, new, old), memory, state.memory)
  return TrainState(step=state.step + 1, params=params, opt_state=opt_state, memory=memory), metrics


def eval_step(params, batch, index, *, model: nn.Module, cfg: StepConfig):
  """Metric sums on one eval batch; its masks depend only on the batch index, so every eval of a run
  (and of runs with other seeds) scores the same masked positions."""
  batch = eval_batch(batch, index, cfg)
  _, (metrics, _) = _loss_fn(params, batch, {"sample": stream_key(EVAL_SEED, index, "eval/sample")}, model, cfg,
                             deterministic=True)
  return metrics
