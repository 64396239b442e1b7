"""`train_and_evaluate(config, workdir)`: the whole pretraining run, read top to bottom.

Setup -> mesh -> data -> model and state (resumed, initialized from weights, or fresh) -> for each step:
train, log, eval, checkpoint. Only process 0 writes logs; every process runs the same JAX code.
"""

import dataclasses
import functools
import json
import os
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import linen as nn

from bertjax import checkpoint, config as config_lib, flops, optim, sharding, step as step_lib
from bertjax.data import pipeline
from bertjax.errors import UserError
from bertjax.metrics import MetricWriter, finalize, sum_metrics
from bertjax.model.pretrain import Pretrainer

# Keys that may change between a run and its resumption (they do not change what is being trained).
RESUMABLE_KEYS = ("total_steps", "log_every", "eval_every", "checkpoint_every", "keep_checkpoints", "overwrite",
                  "init_from", "eval_batch_size", "sharding", "mesh")


def make_model(config) -> Pretrainer:
  """The pretraining model of a config (heads and generator follow from the objectives)."""
  objectives = config_lib.active_objectives(config)
  return Pretrainer(
      cfg=config_lib.encoder_config(config.model),
      generator=config_lib.encoder_config(config.model, generator=True) if "rtd" in objectives else None,
      sentence_head=bool({"nsp", "sop"} & set(objectives)),
      sample_temperature=config.model.sample_temperature,
  )


def dummy_batch(config, batch_size: int = 1) -> dict:
  s, p = config.seq_len, config_lib.masking_config(config).max_predictions
  ints = lambda *shape: jnp.zeros(shape, jnp.int32)
  return dict(input_ids=ints(batch_size, s), original_ids=ints(batch_size, s), type_ids=ints(batch_size, s),
              groups=jnp.ones((batch_size, s), jnp.int32), mlm_positions=ints(batch_size, p),
              mlm_weights=jnp.zeros((batch_size, p)))


def init_state(rng, model, tx, config):
  """A fresh TrainState whose parameters still carry their logical-axis boxes."""
  params = model.init({"params": rng, "sample": rng, "dropout": rng}, dummy_batch(config))["params"]
  return step_lib.TrainState(step=jnp.zeros((), jnp.int32), params=params, opt_state=tx.init(params))


def state_shardings(model, tx, config, mesh, rules):
  """(abstract boxed state, NamedShardings of the unboxed state) from the model's logical axis names."""
  boxed = jax.eval_shape(functools.partial(init_state, model=model, tx=tx, config=config), jax.random.key(0))
  return boxed, sharding.logical_shardings(boxed, mesh, rules)


def manifest(config, tokenizer, mesh) -> dict:
  """What a checkpoint needs to be reproduced: config, versions, commit, tokenizer, mesh."""
  import flax, optax, orbax.checkpoint as ocp, bertjax

  commit = ""
  try:
    import subprocess

    here = os.path.dirname(os.path.abspath(__file__))
    commit = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True,
                            timeout=5).stdout.strip()
  except Exception:
    pass
  return dict(config=json.loads(config.to_json()), bertjax=bertjax.__version__, git_commit=commit,
              jax=jax.__version__, flax=flax.__version__, optax=optax.__version__, orbax=ocp.__version__,
              tokenizer=dict(spec=tokenizer.spec(), fingerprint=tokenizer.fingerprint, vocab_size=tokenizer.vocab_size),
              mesh=dict(mesh.shape))


def check_workdir(config, workdir: str):
  """Refuses a workdir that holds another config's run (unless overwrite); records this config there."""
  try:
    os.makedirs(workdir, exist_ok=True)
    probe = os.path.join(workdir, ".write_test")
    open(probe, "w").close()
    os.remove(probe)
  except OSError as e:
    raise UserError(f"workdir {workdir!r} is not writable ({e.strerror}); choose another --workdir")
  path = os.path.join(workdir, "config.json")
  mine = {k: v for k, v in json.loads(config.to_json()).items() if k not in RESUMABLE_KEYS}
  if os.path.exists(path):
    theirs = {k: v for k, v in json.load(open(path)).items() if k not in RESUMABLE_KEYS}
    if theirs != mine and not config.overwrite:
      diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
      raise UserError(f"workdir {workdir!r} holds a run of another config (differs in {', '.join(diff)}); "
                      "use another --workdir, or --config.overwrite=True to replace it")
    if theirs != mine:
      import shutil

      shutil.rmtree(os.path.join(workdir, "checkpoints"), ignore_errors=True)
      for name in os.listdir(workdir):
        if name == "metrics.jsonl" or name.startswith("events.out"):
          os.remove(os.path.join(workdir, name))
  if jax.process_index() == 0:
    with open(path, "w") as f:
      f.write(config.to_json(indent=2))


def describe_data(data: pipeline.Dataset) -> str:
  """One line of counts about the data (documents, instances, label balance, skipped input)."""
  src, train, ev = data.stats["source"], data.stats["train"], data.stats["eval"]
  line = (f"data: {src.documents} documents, {src.sentences} sentences; {data.stats['format']} instances: "
          f"train {train.instances} (label-1 share {train.label_balance:.3f}), eval {ev.instances}; "
          f"documents too short for a pair {train.too_short_documents}; tokenizer {data.tokenizer.spec()}")
  if src.invalid_lines:
    line += f"; {src.invalid_lines} lines of invalid UTF-8 skipped"
  return line


def global_batch(host_batch: dict, mesh) -> dict:
  """This host's rows -> global jax.Arrays split over (data, fsdp): no host holds the global batch."""
  spec = jax.sharding.NamedSharding(mesh, sharding.batch_spec())
  return {k: jax.make_array_from_process_local_data(spec, v) for k, v in host_batch.items()}


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str):
  """Pretrains as the config says, writing metrics, TensorBoard events and checkpoints to workdir."""
  # ---------------------------------------------------------------- Setup
  config_lib.validate(config)
  check_workdir(config, workdir)
  n_proc, proc = jax.process_count(), jax.process_index()
  mesh = sharding.make_mesh(config.sharding, overrides=dict(config.mesh))
  rules = sharding.rules_for(config.sharding)
  # The mesh and rules are set for the whole run: the model's logical constraints are resolved when
  # the steps are first traced, which happens inside the loop.
  jax.set_mesh(mesh)
  nn.set_logical_axis_rules(rules)
  n_dev = jax.device_count()
  if config.batch_size % n_dev or (config.batch_size // config.grad_accum_steps) % n_dev:
    raise UserError(f"batch_size={config.batch_size} (microbatch {config.batch_size // config.grad_accum_steps}) "
                    f"is not divisible by the {n_dev} devices; use a multiple of {n_dev}")
  eval_bs = config.eval_batch_size or config.batch_size
  if eval_bs % n_dev:
    raise UserError(f"eval_batch_size={eval_bs} is not divisible by the {n_dev} devices; use a multiple of {n_dev}")
  writer = MetricWriter(workdir, enabled=proc == 0)

  # ---------------------------------------------------------------- Data
  t0 = time.time()
  data = pipeline.build(config)
  tok = data.tokenizer
  writer.info(describe_data(data) + f" [{time.time() - t0:.1f}s]")
  tokens_per_step = config.batch_size * config.seq_len
  writer.info(f"processes {n_proc}, devices {n_dev}, mesh {dict(mesh.shape)}; batch global {config.batch_size}, "
              f"per host {config.batch_size // n_proc}, per device {config.batch_size // n_dev}; "
              f"{tokens_per_step} tokens/step")

  # ---------------------------------------------------------------- Model, optimizer, steps
  model = make_model(config)
  tx = optim.make(config)
  special = tok.special
  step_cfg = step_lib.StepConfig(
      seed=config.seed, masking=config_lib.masking_config(config),
      special_ids=(special.pad, special.unk, special.cls, special.sep, special.mask), mask_id=special.mask,
      vocab_size=config.model.vocab_size, objectives=tuple(config_lib.active_objectives(config).items()),
      grad_accum_steps=config.grad_accum_steps)
  boxed, shardings = state_shardings(model, tx, config, mesh, rules)
  batch_sharding = jax.sharding.NamedSharding(mesh, sharding.batch_spec())
  repl = sharding.replicated(mesh)
  train_step = jax.jit(
      functools.partial(step_lib.train_step, model=model, tx=tx, cfg=step_cfg),
      in_shardings=(shardings, batch_sharding), out_shardings=(shardings, repl), donate_argnums=(0,))
  eval_step = jax.jit(functools.partial(step_lib.eval_step, model=model, cfg=step_cfg),
                      in_shardings=(shardings.params, batch_sharding, repl), out_shardings=repl)

  # ---------------------------------------------------------------- State
  # Resume order: (1) the latest checkpoint in workdir (same run, exact), (2) weights from
  # config.init_from (a new run: fresh optimizer, step 0), (3) a fresh initialization.
  ckpt = checkpoint.Checkpointer(workdir, keep=config.keep_checkpoints)
  abstract = jax.tree.map(lambda s, sh: jax.ShapeDtypeStruct(s.shape, s.dtype, sharding=sh),
                          sharding.strip_boxes(boxed), shardings)
  if ckpt.latest_step() is not None:
    state = ckpt.restore(abstract)
    writer.info(f"resumed from {ckpt.directory} at step {int(state.step)}")
  else:
    # Initialized already sharded: each device computes only its own shards, nothing built on host.
    init = jax.jit(lambda r: nn.unbox(init_state(r, model, tx, config)), out_shardings=shardings)
    state = init(jax.random.key(config.seed))
    if config.init_from:
      params = checkpoint.restore_params(config.init_from, abstract.params)
      state = dataclasses.replace(state, params=params)
      writer.info(f"initialized weights from {config.init_from}")
  start = int(state.step)
  man = manifest(config, tok, mesh)
  n_params = sum(x.size for x in jax.tree.leaves(state.params))
  flops_per_token = flops.train_flops_per_token(
      model.cfg, config.seq_len, step_cfg.masking.max_predictions, model.generator, model.sentence_head)
  peak = flops.peak_flops(jax.devices()[0]) * n_dev
  writer.info(f"model: {n_params:,} parameters, {flops_per_token / 1e6:.1f} MFLOPs/token (train)")

  def evaluate(step: int):
    sums = None
    for i, host_batch in enumerate(pipeline.eval_batches(data.eval, eval_bs, proc, n_proc)):
      m = eval_step(state.params, global_batch(host_batch, mesh), jnp.int32(i))
      sums = m if sums is None else sum_metrics(sums, m)
    writer.write(step, {f"eval/{k}": v for k, v in finalize(jax.device_get(sums)).items()})

  # ---------------------------------------------------------------- Train
  pending, t_log, step_log = [], time.time(), start
  t_start = time.time()
  for step in range(start, config.total_steps):
    host = pipeline.batch_at(data.train, step, config.batch_size, config.seed, proc, n_proc)
    state, metrics = train_step(state, global_batch(host, mesh))
    pending.append(metrics)  # stays on device until the next log (fetching every step halves speed)
    done = step + 1
    if done % config.log_every == 0 or done == config.total_steps:
      summed = functools.reduce(sum_metrics, pending)
      values = {f"train/{k}": v for k, v in finalize(jax.device_get(summed)).items()}
      dt = time.time() - t_log
      values["lr"] = float(optim.schedule(config)(done - 1))
      values["tokens_per_sec"] = (done - step_log) * tokens_per_step / dt
      if peak:
        values["mfu"] = values["tokens_per_sec"] * flops_per_token / peak
      writer.write(done, values)
      writer.progress(done, config.total_steps, values, time.time() - t_start, done - start)
      pending, t_log, step_log = [], time.time(), done
    if done % config.eval_every == 0 or done == config.total_steps:
      evaluate(done)
    if done % config.checkpoint_every == 0 or done == config.total_steps:
      ckpt.save(done, state, man, force=True)
  ckpt.close()
  writer.close()
  return state
