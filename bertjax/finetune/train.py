"""`finetune(config, workdir)`: load a pretrained encoder, fine-tune it once per seed, report the task
metrics per seed and their median and mean +- std.

Setup (checkpoint, tokenizer, data, step count) happens once; every seed then re-initializes the head,
reshuffles the data (batches are a pure function of (seed, step), as in pretraining) and draws its own
dropout. Runs on the default device with jit (fine-tuning sets are small; no mesh needed).
"""

import dataclasses
import functools
import json
import math
import os
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax.compress import q8bert, quantize
from bertjax.core import config as config_lib
from bertjax.core.errors import UserError
from bertjax.data import trees
from bertjax.finetune import batches, resume, tasks
from bertjax.finetune.classification import task as classification
from bertjax.finetune.model import MODEL_DIR, layer_multipliers, scale_by_tree
from bertjax.hf import inference
from bertjax.model import config as model_config, unstacked
from bertjax.train import optim
from bertjax.train.metrics import MetricWriter


EPOCH_MODES = ("bert", "transformers")


def _check(ok: bool, message: str):
  if not ok:
    raise UserError(message)


def validate(config):
  """One-line errors for a fine-tuning config that cannot run: the trainer's settings, then the task's."""
  _check(bool(config.init.checkpoint), "set --config.init.checkpoint to a bertjax workdir or an HF checkpoint dir")
  _check(config.seeds >= 1, f"seeds={config.seeds} must be at least 1")
  _check(config.batch_size > 0 and config.eval_batch_size > 0, "batch sizes must be positive")
  _check(0 < config.optimizer.layerwise_decay <= 1, "optimizer.layerwise_decay must be in (0, 1]")
  _check(config.model.get("quantize", "") in quantize.MODES,
         f"model.quantize={config.model.get('quantize')!r}; use int8 (qwix), q8bert or leave it empty")
  model_config.check_dropout_rng(config.model)
  _check(config.model.dtype in config_lib.DTYPES, f"model.dtype={config.model.dtype!r}; use float32 or bfloat16")
  _check(config.epoch_mode in EPOCH_MODES, f"epoch_mode={config.epoch_mode!r}; use one of {', '.join(EPOCH_MODES)}")
  _check(config.optimizer.schedule in optim.SCHEDULES,
         f"optimizer.schedule={config.optimizer.schedule!r}; use one of {', '.join(optim.SCHEDULES)}")
  _check(config.get("checkpoint_every", 0) >= 0, f"checkpoint_every={config.get('checkpoint_every')} must be >= 0")
  _check(config.get("length_window", 0) >= 0, f"length_window={config.get('length_window')} must be >= 0")
  _check(not config.get("pack_train", False) or tasks.kind_of(config) == "classification",
         f"pack_train=True packs classification batches only; this task is {tasks.kind_of(config)}: set "
         "--config.pack_train=False")
  batches.bucket_lengths(config)
  tasks.get(config).validate(config)


def load_checkpoint(init) -> inference.Loaded:
  """A bertjax workdir (it has checkpoints/) or an HF checkpoint directory."""
  path = init.checkpoint
  if os.path.isdir(os.path.join(path, "checkpoints")):
    return inference.load(workdir=path)
  if os.path.isfile(os.path.join(path, "config.json")):
    return inference.load(hf_dir=path, generator_dir=init.generator_dir)
  raise UserError(f"{path!r} is neither a bertjax workdir (with checkpoints/) nor an HF checkpoint (with "
                  "config.json); fix --config.init.checkpoint")


def encoder_config(config, loaded: inference.Loaded):
  """The checkpoint's main encoder with the fine-tuning dropout, its masks' generator and dtype; dropout masks
  are drawn at seq_len, so a length bucket's batch gets the fixed-length batch's masks
  (EncoderConfig.dropout_length)."""
  enc = model_config.encoder_config(loaded.config.model)
  m = config.model
  return dataclasses.replace(
      enc, dtype=config_lib.DTYPES[m.dtype], dropout_length=config.seq_len,
      dropout_rng=model_config.dropout_rng(m.get("dropout_rng", "auto"), jax.default_backend()),
      dropout=enc.dropout if m.dropout < 0 else m.dropout,
      attention_dropout=enc.attention_dropout if m.attention_dropout < 0 else m.attention_dropout)


def step_counts(config, num_examples: int) -> tuple[int, int]:
  """(total steps, warmup steps) of a run over `num_examples`, as config.epoch_mode counts them."""
  per_epoch = num_examples / config.batch_size
  if config.epoch_mode == "transformers":
    total = config.total_steps or max(1, int(math.ceil(per_epoch) * config.epochs))
    warmup = int(math.ceil(config.warmup_fraction * total))
  else:
    total = config.total_steps or max(1, int(config.epochs * per_epoch))
    warmup = int(config.warmup_fraction * total)
  return total, warmup if config.warmup_steps < 0 else config.warmup_steps


def train_batch(arrays, step: int, config, seed: int, layout: batches.Layout | None = None) -> dict:
  """Training batch `step`, a pure function of (seed, step) (bertjax.finetune.batches): epoch_mode bert,
  full batches from a stream of reshuffled epochs; transformers, epoch-aligned batches whose last one is
  padded with weight-0 rows. With a `layout`, rows are grouped by length (length_window) and the batch is
  cut to its length bucket; without one, it is as wide as the arrays."""
  lengths = None if layout is None else layout.lengths
  rows = batches.batch_rows(len(arrays["input_ids"]), step, config, seed, lengths)
  return batches.take(arrays, rows, layout or batches.fixed_layout(arrays))


def lr_schedule(config, total: int, warmup: int):
  """The fine-tuning schedule (optimizer.schedule) over this task's step counts."""
  return optim.schedule(config.optimizer.schedule, config.learning_rate, warmup, total)


def make_tx(config, params, cfg, total: int, warmup: int, stage: tasks.Stage | None = None
            ) -> optax.GradientTransformation:
  """The fine-tuning optimizer: bertjax.train.optim's (AdamW, schedule, decay mask, clipping) over `total`
  steps, then ELECTRA's layer-wise rate multipliers when optimizer.layerwise_decay < 1. A training `stage`
  scales the rate and masks what it does not train: gradients before the optimizer (clipping sees only what
  trains) and updates after it (no weight decay on frozen parameters)."""
  scale = 1.0 if stage is None else stage.lr_scale
  schedule = lr_schedule(config, total, warmup)
  tx = optim.make(config.optimizer, schedule if scale == 1 else lambda s: schedule(s) * scale)
  if config.optimizer.layerwise_decay < 1:
    tx = optax.chain(tx, scale_by_tree(layer_multipliers(params, cfg, config.optimizer.layerwise_decay)))
  if stage is not None and stage.trainable is not None:
    mask = stage.trainable(params)
    tx = optax.chain(scale_by_tree(mask), tx, scale_by_tree(mask))
  return tx


def training_stages(task, config) -> list:
  """The task's training stages (`task.stages(config)`: early exit's two-stage methods), else one stage of
  `task.loss` training everything."""
  return task.stages(config) if hasattr(task, "stages") else [tasks.Stage(task.loss)]


def packed_inputs(batch, model=None) -> dict:
  """The model's extra inputs: packed rows' (--config.pack_train: batches.packed), the batch fields the model
  names in its `batch_inputs` (a graph's links) and a tree model's node spans (`inputs`: bertjax.data.trees),
  else nothing."""
  names = ("position_ids", "cls_positions") + tuple(getattr(model, "batch_inputs", ()))
  out = {k: batch[k] for k in names if k in batch}
  return dict(out, inputs={k: batch[k] for k in trees.FIELDS}) if trees.FIELDS[0] in batch else out


def batch_loss(params, batch, rng, model, task_loss, head_gates=None):
  """The batch's mean task loss: the task's per-example losses weighted by example_weight (padding rows
  weigh 0). `task_loss(outputs, batch)` returns per-example losses [B], or (numerator [B], denominator [B])
  for a loss averaged over units other than examples (e.g. tokens). `rng` None for a deterministic model,
  `head_gates` [layers, heads] for bertjax.compress.prune's importance."""
  packed = packed_inputs(batch, model)
  out = model.apply({"params": params}, batch["input_ids"], batch["type_ids"], batch["groups"],
                    *(() if head_gates is None else (head_gates,)), rngs={"dropout": rng} if rng is not None else {},
                    **packed)
  return _mean_loss(task_loss(out, batch), batch)


def stateful_loss(params, state, batch, rng, model, task_loss):
  """(batch_loss, the updated `state`): for a model whose forward pass updates non-trainable collections
  (`state`, e.g. q8bert's activation ranges), applied with them mutable."""
  packed = packed_inputs(batch, model)
  out, state = model.apply({"params": params, **state}, batch["input_ids"], batch["type_ids"], batch["groups"],
                           rngs={"dropout": rng} if rng is not None else {}, mutable=list(state), **packed)
  return _mean_loss(task_loss(out, batch), batch), state


def _mean_loss(per, batch):
  num, den = per if isinstance(per, tuple) else (per, jnp.ones_like(per))
  w = batch["example_weight"]
  return (num * w).sum() / jnp.maximum((den * w).sum(), 1.0)


def _loss(params, batch, rng, model, regression: bool, head_gates=None):
  """The classification loss (bertjax.compress.prune's importance scores its gradient); `regression` is implied by
  the model's outputs and kept for the callers' signature."""
  del regression
  return batch_loss(params, batch, rng, model, classification.loss, head_gates)


def train_step(params, opt_state, batch, seed, step, state=None, *, model, tx, task_loss=classification.loss):
  """One AdamW step; dropout randomness is fold_in(seed, step) (seed traced: one compile for all seeds).
  With `state` (non-trainable collections the forward pass updates: q8bert's ranges) the updated state is
  returned fourth."""
  rng = jax.random.fold_in(jax.random.key(seed), step)
  if state is None:
    loss, grads = jax.value_and_grad(batch_loss)(params, batch, rng, model, task_loss)
  else:
    (loss, state), grads = jax.value_and_grad(stateful_loss, has_aux=True)(params, state, batch, rng, model,
                                                                           task_loss)
  updates, opt_state = tx.update(grads, opt_state, params)
  out = optax.apply_updates(params, updates), opt_state, loss
  return out if state is None else (*out, state)


@functools.lru_cache(maxsize=4)
def _predict_fn(model):
  return jax.jit(lambda v, b: model.apply(unstacked.join(v), b["input_ids"], b["type_ids"], b["groups"],
                                          **packed_inputs(b, model)))


def predict(params, arrays, model, batch_size: int, layout: batches.Layout | None = None,
            position_axis: int | None = None, state: dict | None = None) -> np.ndarray:
  """Model outputs [N, ...] over a whole split, in its row order. With a `layout`, batches of rows sorted
  by length, each cut to its bucket; outputs with a sequence axis (`position_axis`) are padded back to the
  split's width with 0. `state`: further variable collections, read only (q8bert's frozen ranges)."""
  variables = unstacked.for_calls({"params": params, **(state or {})}, getattr(model, "cfg", None))
  apply = functools.partial(_predict_fn(model), variables)
  layout = layout or batches.fixed_layout(arrays)
  width = np.shape(arrays["input_ids"])[-1]
  order, outs = [], []
  for rows, b in batches.eval_batches(arrays, batch_size, layout):
    names = (*tasks.TOKEN_FIELDS, *getattr(model, "batch_inputs", ()), *trees.FIELDS)
    out = np.asarray(apply({k: b[k] for k in names if k in b}))[:len(rows)]
    if position_axis is not None and out.shape[position_axis] < width:
      pad = [(0, 0)] * out.ndim
      pad[position_axis] = (0, width - out.shape[position_axis])
      out = np.pad(out, pad)
    order.append(rows)
    outs.append(out)
  outs = np.concatenate(outs)
  result = np.empty_like(outs)
  result[np.concatenate(order)] = outs
  return result


def evaluator(config, eval_model, arrays, layout: batches.Layout | None = None, position_axis: int | None = None):
  """(params, state=None) -> model outputs over `arrays` (`predict`): the float model; with model.quantize=int8
  the qwix int8 model (int8 weights and matmuls in the encoder) made from the params; with q8bert the Q8BERT
  int8 model with the ranges in `state` frozen."""
  run = lambda model, params, state=None: predict(params, arrays, model, config.eval_batch_size, layout,
                                                  position_axis, state)
  if not config.model.quantize:
    return lambda params, state=None: run(eval_model, params)
  if config.model.quantize == "q8bert":
    return functools.partial(run, q8bert.model(eval_model))
  q = quantize.int8(eval_model)
  ids = np.zeros((1, 8), np.int32)
  return lambda params, state=None: run(q, quantize.int8_params(q, params, ids, ids, ids + 1))


def seed_start(config, seed: int, setup: dict) -> tuple:
  """(training model, starting params) of `seed`: the pretrained encoder (and whatever else the task
  starts from the checkpoint) and a head drawn from key(seed)."""
  task = setup["task"]
  train_model = task.model(config, setup["cfg"], setup["data"], deterministic=False)
  params = task.init_params(train_model, jax.random.key(seed), setup["loaded"])[0]
  # The step donates its params, and the checkpoint's arrays are on the device and shared by every seed (and the
  # evaluation): each seed trains its own copy, else the next seed finds the donated buffers deleted.
  return train_model, jax.tree.map(jnp.copy, params)


def run_seed(config, seed: int, setup: dict, workdir: str) -> dict:
  """Fine-tunes once with `seed`; returns the task's final eval metrics (and writes them per step). With
  config.checkpoint_every, resumes from the seed's latest checkpoint, or returns a finished seed's result.json."""
  task, total, warmup = setup["task"], setup["total"], setup["warmup"]
  seed_dir = os.path.join(workdir, f"seed_{seed}")
  os.makedirs(seed_dir, exist_ok=True)
  every = config.get("checkpoint_every", 0)
  resumed = resume.saved_progress(config, seed_dir) if every else {}
  if "result" in resumed:
    print(f"seed {seed}: finished earlier, reusing {os.path.join(seed_dir, resume.RESULT_FILE)}", flush=True)
    setup.setdefault("timing", []).append(resumed["timing"])
    return resumed["result"]
  ckpt = resume.checkpointer(seed_dir) if every else None
  start, recipe = resumed.get("step", 0), resume.recipe_digest(config)
  train_model, params = seed_start(config, seed, setup)
  eval_model = train_model.clone(deterministic=True)
  outputs_of = evaluator(config, eval_model, setup["eval"], setup["eval_layout"],
                         getattr(task, "OUTPUT_POSITION_AXIS", None))
  state = None  # non-trainable collections the training forward pass updates
  if config.model.quantize == "int8":  # QAT: int8 fake quantization of the encoder's matmuls (qwix), STE gradients
    train_model = quantize.qat(train_model)
  elif config.model.quantize == "q8bert":  # QAT: fake quantization with EMA ranges (bertjax.compress.q8bert)
    train_model = q8bert.model(train_model)
    ids = np.zeros((1, 8), np.int32)
    state = q8bert.init_ranges(train_model, ids, ids, ids + 1)
  stages = training_stages(task, config)
  writer = MetricWriter(seed_dir)
  train, layout = setup["train"], setup["train_layout"]
  seconds_eval = resumed.get("eval_seconds", 0.0)
  losses, t0, t_log = [], time.time() - resumed.get("train_seconds", 0.0) - seconds_eval, time.time()
  positions = real = 0  # computed token positions and real tokens since the last log line
  positions_all, real_all = resumed.get("positions", 0), resumed.get("real", 0)
  result = {}
  for step in range(start, total * len(stages)):  # each stage: `total` steps over the same batches, a fresh optimizer
    stage, stage_step = divmod(step, total)
    if stage_step == 0 or step == start:
      tx = make_tx(config, params, setup["cfg"], total, warmup, stages[stage])
      opt_state = tx.init(params)
      if step == start and start:  # a resumed seed: its saved state, in the layout of a fresh one
        saved = ckpt.restore(resume.tree(params, opt_state, state), start)
        params, opt_state, state = saved["params"], saved["opt_state"], saved.get("state")
        print(f"seed {seed}: resumed at step {start} from {ckpt.directory}", flush=True)
      step_fn = setup.setdefault(("step_fn", stage), jax.jit(functools.partial(
          train_step, model=train_model, tx=tx, task_loss=stages[stage].loss), donate_argnums=(0, 1, 5)))
    batch = train_batch(train, stage_step, config, seed, layout)
    if config.get("pack_train", False):  # several examples a row, no compute on padding (classification)
      batch = batches.packed(batch, config.seq_len)
    params, opt_state, loss, *new_state = step_fn(params, opt_state, batch, jnp.uint32(seed), jnp.int32(step), state)
    state = new_state[0] if new_state else None
    losses.append(loss)
    computed, real_now = batch["input_ids"].size, int(np.count_nonzero(batch["groups"]))
    positions, real, positions_all, real_all = positions + computed, real + real_now, positions_all + computed, \
        real_all + real_now
    done = step + 1
    if done % config.log_every == 0 or done == total * len(stages):
      values = {"train/loss": float(np.mean(jax.device_get(losses))), "lr": float(lr_schedule(
          config, total, warmup)(stage_step)) * stages[stage].lr_scale, "tokens_per_sec": positions / (time.time() - t_log),
          "real_token_share": real / positions}
      writer.write(done, values)
      writer.progress(done, total * len(stages), values, time.time() - t0, done)
      losses, t_log, positions, real = [], time.time(), 0, 0
    if (config.eval_every and done % config.eval_every == 0) or done == total * len(stages):
      jax.block_until_ready(params)  # the steps still in flight are training time
      t_eval = time.time()
      result = task.evaluate(outputs_of(params, state), setup["data"], config, seed_dir)
      writer.write(done, {f"eval/{k}": v for k, v in result.items()})
      seconds_eval += time.time() - t_eval
    if ckpt and done % every == 0 and done % total:  # not at a stage's end: the next stage starts a fresh optimizer
      ckpt.save(done, resume.tree(params, opt_state, state), dict(
          step=done, recipe=recipe, train_seconds=time.time() - t0 - seconds_eval,
          eval_seconds=seconds_eval, positions=positions_all, real=real_all))
  writer.close()
  # The seed's cost (compiles included, so the first seed of a run pays them): training steps, evaluations,
  # and the share of the token positions computed that were real tokens (what length buckets raise).
  timing = dict(train_seconds=time.time() - t0 - seconds_eval, eval_seconds=seconds_eval,
                real_token_share=real_all / positions_all, buckets=[int(b) for b in layout.buckets])
  setup.setdefault("timing", []).append(timing)
  if config.save_model and hasattr(task, "save_model"):
    # The run config names the tokenizer the run used: a pretraining workdir's may be its cache's, unnamed in its
    # config, and the saved model must find it without the workdir it came from.
    run_config = setup["run_config"].copy_and_resolve_references()
    run_config.data.tokenizer = setup["info"]["tokenizer"]
    task.save_model(os.path.join(seed_dir, MODEL_DIR), run_config, eval_model, params)
    if state is not None:  # the learned ranges travel with the model (q8bert.load_ranges reads them)
      q8bert.save_ranges(os.path.join(seed_dir, MODEL_DIR), state)
  if ckpt:
    resume.finish(ckpt, seed_dir, dict(recipe=recipe, result=result, timing=timing))
  return result


def summarize(per_seed: list) -> dict:
  """name -> dict(median, mean, std, values) over seeds (std with ddof 0, as numpy's default)."""
  out = {}
  for name in per_seed[0]:
    values = np.array([m[name] for m in per_seed], np.float64)
    out[name] = dict(median=float(np.median(values)), mean=float(values.mean()), std=float(values.std()),
                     values=[float(v) for v in values])
  return out


def fit_type_ids(arrays: dict, type_vocab_size: int) -> dict:
  """`arrays`' segment ids cut to the encoder's table, in place: a model of one segment type (RoBERTa's shape) reads
  a pair's second segment as type 0, as RoBERTa's own tokenizer encodes it (bertjax's tokenizers give it type 1,
  and an id past the table embeds as NaN). Without a table (type_vocab_size 0) the ids are unread."""
  if type_vocab_size and "type_ids" in arrays:
    arrays["type_ids"] = np.minimum(arrays["type_ids"], type_vocab_size - 1).astype(arrays["type_ids"].dtype)
  return arrays


def prepare(config) -> dict:
  """Everything the seeds share: checkpoint, encoder config, the task's encoded splits, step counts. The task's
  files are read and checked first, so a bad one fails in seconds, before the checkpoint is loaded."""
  task = tasks.get(config)
  raw = task.read(config)
  loaded = load_checkpoint(config.init)
  if loaded.tokenizer is None:
    raise UserError(f"{config.init.checkpoint} has no tokenizer; fine-tuning needs the checkpoint's own")
  cfg = encoder_config(config, loaded)
  _check(config.seq_len + cfg.position_offset <= cfg.max_positions,
         f"seq_len={config.seq_len} exceeds the checkpoint's {cfg.max_positions} positions; lower --config.seq_len")
  _check(config.model.quantize != "q8bert" or cfg.sharing == "none",
         f"model.quantize=q8bert needs unshared layers; this checkpoint shares them (sharing={cfg.sharing})")
  data = task.prepare(config, loaded, raw)
  for arrays in (data.train, data.eval):
    fit_type_ids(arrays, cfg.type_vocab_size)
  total, warmup = step_counts(config, len(data.train["input_ids"]))
  longest = batches.batch_longest(batches.row_lengths(data.train), total, config,
                                  [config.seed + s for s in range(config.seeds)])
  train_layout = batches.layout(config, data.train, data.token_fields, fit_to=longest)
  return dict(
      task=task, data=data, loaded=loaded, cfg=cfg, total=total, warmup=min(warmup, total),
      run_config=loaded.config, train=data.train, eval=data.eval,
      train_layout=train_layout,
      eval_layout=batches.layout(config, data.eval, data.token_fields, buckets=train_layout.buckets),
      info=dict(data.info, kind=tasks.kind_of(config), tokenizer=loaded.tokenizer.spec(),
                model=dict(layers=cfg.num_layers, hidden=cfg.hidden_size, heads=cfg.num_heads)),
  )


def finetune(config, workdir: str) -> dict:
  """Runs all seeds; writes workdir/results.json and returns it (per-seed metrics and their summary)."""
  validate(config)
  if config.get("checkpoint_every", 0):  # before anything is written: a workdir of another recipe stays as it is
    for s in range(config.seeds):
      resume.saved_progress(config, os.path.join(workdir, f"seed_{config.seed + s}"))
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config.to_json(indent=2))
  t0 = time.time()
  setup = prepare(config)
  info = setup["info"]
  extra = (f"; pooler {info['pooler']}" if "pooler" in info else "") + (
      f"; pooling {info['pooling']}" if "pooling" in info else "")
  print(f"task {config.task.name}: {info['train_examples']} train / {info['eval_examples']} eval examples "
        f"({info.get('skipped_rows', 0)} rows skipped); {setup['total']} steps x batch {config.batch_size}; "
        f"model {info['model']}{extra} [{time.time() - t0:.1f}s]", flush=True)
  per_seed = []
  for s in range(config.seeds):
    per_seed.append(run_seed(config, config.seed + s, setup, workdir))
    print(f"seed {config.seed + s}: " + ", ".join(f"{k} {v:.4f}" for k, v in per_seed[-1].items()), flush=True)
  summary = summarize(per_seed)
  for name, s in summary.items():
    print(f"{config.task.name} {name}: median {s['median']:.4f}, mean {s['mean']:.4f} +- {s['std']:.4f} "
          f"over {len(per_seed)} seeds", flush=True)
  results = dict(task=config.task.name, seeds=[config.seed + s for s in range(config.seeds)], per_seed=per_seed,
                 summary=summary, steps=setup["total"], timing=setup["timing"], **info)
  with open(os.path.join(workdir, "results.json"), "w") as f:
    json.dump(results, f, indent=2)
  return results
