"""`train_and_evaluate(config, workdir)`: the whole pretraining run, read top to bottom.

Setup -> mesh -> data -> model and state (resumed, initialized from weights, or fresh) -> for each step:
train, log, eval, checkpoint. Only process 0 writes logs; every process runs the same JAX code.
"""

import contextlib
import dataclasses
import functools
import json
import os
import shutil
import signal
import sys
import time

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from bertjax.core import config as config_lib, runtime, saved as saved_config, sharding, supervisor
from bertjax.core.errors import RestartableError, UserError
from bertjax.core.metrics import finalize, sum_metrics
from bertjax.data import instances, pipeline
from bertjax.model import flops
from bertjax.model.pretrain import Pretrainer
from bertjax.objectives import masking
from bertjax.train import build, checkpoint
from bertjax.train.metrics import MetricWriter

# Keys that may change between a run and its resumption (they do not change what is being trained).
RESUMABLE_KEYS = ("total_steps", "log_every", "eval_every", "checkpoint_every", "keep_checkpoints", "overwrite",
                  "init_from", "eval_batch_size", "sharding", "sharding_rules", "mesh", "max_nonfinite_steps",
                  "startup_timeout", "heartbeat_timeout")


# Published checkpoint formats that `init_from` may name, by prefix ("hf:" -> bertjax.hf.init_from, which
# registers itself on import; `python -m bertjax.train` imports it): each has resolve(config, overridden) -> the
# config with the checkpoint's architecture, and load_params(config, params) -> (params, report lines). The
# pretraining run knows no format from the layers above it; a bertjax workdir it restores itself.
INIT_SOURCES: dict = {}


def register_init_source(prefix: str, source):
  """Makes `init_from=PREFIX...` load through `source` (a module or object with resolve and load_params)."""
  INIT_SOURCES[prefix] = source


def _init_source(spec: str):
  """The registered source for an init_from spec, or None for a bertjax workdir (or an empty spec)."""
  source = next((s for prefix, s in INIT_SOURCES.items() if spec.startswith(prefix)), None)
  if source is None and spec.startswith("hf:"):
    raise UserError(f"--config.init_from={spec}: HF checkpoints load through bertjax.hf.init_from; run "
                    "python -m bertjax.train (or import bertjax.hf.init_from first)")
  return source


def load_init_params(config, params) -> tuple[dict, list]:
  """(params, report lines): `params` (fresh, on the mesh) with the weights of config.init_from put in: a
  bertjax workdir's, or a registered format's (what that checkpoint lacks stays fresh)."""
  source = _init_source(config.init_from)
  if source is not None:
    return source.load_params(config, params)
  restored = checkpoint.restore_params(config.init_from, jax.tree.map(
      lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), params))
  return restored, [f"initialized weights from {config.init_from}"]


def manifest(config, tokenizer, mesh, model: Pretrainer) -> dict:
  """What a checkpoint needs to be reproduced and read: config, versions, commit, tokenizer, mesh, and
  which top-level parameter groups form which network (ELECTRA holds two)."""
  import flax, optax, orbax.checkpoint as ocp, subprocess, bertjax

  try:
    here = os.path.dirname(os.path.abspath(__file__))
    commit = subprocess.run(["git", "-C", here, "rev-parse", "HEAD"], capture_output=True, text=True,
                            timeout=5).stdout.strip()
  except Exception:
    commit = ""
  return dict(config=json.loads(config.to_json()), bertjax=bertjax.__version__, git_commit=commit,
              jax=jax.__version__, flax=flax.__version__, optax=optax.__version__, orbax=ocp.__version__,
              tokenizer=dict(spec=tokenizer.spec(), fingerprint=tokenizer.fingerprint, vocab_size=tokenizer.vocab_size),
              mesh=dict(mesh.shape), networks=model.networks)


# Nested keys that may change too: how hard to check the data, how long to wait for its preparation, and the
# watchdog's patience.
RESUMABLE_NESTED = (("data", "verify"), ("data", "prepare_wait_s"), ("runtime", "step_timeout_s"))


def _comparable(config_dict: dict) -> dict:
  out = {k: v for k, v in config_dict.items() if k not in RESUMABLE_KEYS}
  for section, key in RESUMABLE_NESTED:
    if isinstance(out.get(section), dict):
      out[section] = {k: v for k, v in out[section].items() if k != key}
  return out


def resumed_config(config, workdir: str):
  """`config`, or, where the workdir holds a run of it saved before some of its keys existed, `config` with
  those keys at the values that run ran under (core.saved.PREDATED: e.g. an old LAMB run kept ALBERT's uncorrected
  Adam after optimizer.bias_correction came with another default), so the run resumes as it ran, with a note.
  A run that differs in anything else is left to check_workdir to refuse or replace."""
  path = os.path.join(workdir, "config.json")
  if not os.path.isfile(path):
    return config
  with open(path) as f:
    saved = json.load(f)
  old = saved_config.predated(saved)
  if not old:
    return config
  adopted = config.copy_and_resolve_references()
  for (section, key), value in old.items():
    adopted[section][key] = value
  if _comparable(json.loads(adopted.to_json())) != _comparable(json.loads(saved_config.from_saved(saved).to_json())):
    return config
  for (section, key), value in old.items():
    if config[section][key] != value and jax.process_index() == 0:
      print(f"resume: the run in {workdir} predates {section}.{key} and ran with {value!r} (this config says "
            f"{config[section][key]!r}); it resumes as it ran", file=sys.stderr, flush=True)
  return adopted


def check_workdir(config, workdir: str) -> bool:
  """Refuses an unwritable workdir, or one holding another config's run unless overwrite is set.
  Returns whether the workdir's old run is to be replaced. Writes nothing."""
  try:
    os.makedirs(workdir, exist_ok=True)
    probe = os.path.join(workdir, f".write_test.{os.getpid()}")
    open(probe, "w").close()
    os.remove(probe)
  except OSError as e:
    raise UserError(f"workdir {workdir!r} is not writable ({e.strerror}); choose another --workdir")
  path = os.path.join(workdir, "config.json")
  if not os.path.exists(path):
    return False
  # The saved config over today's defaults: a key added since the run was saved takes its default.
  theirs = json.loads(saved_config.from_saved(json.load(open(path))).to_json())
  mine, theirs = _comparable(json.loads(config.to_json())), _comparable(theirs)
  if theirs == mine:
    return False
  if not config.overwrite:
    diff = sorted(k for k in set(mine) | set(theirs) if mine.get(k) != theirs.get(k))
    raise UserError(f"workdir {workdir!r} holds a run of another config (differs in {', '.join(diff)}); "
                    "use another --workdir, or --config.overwrite=True to replace it")
  return True


def claim_workdir(config, workdir: str, replace: bool):
  """Records the config in the workdir (process 0), first removing a replaced run's outputs."""
  if jax.process_index() != 0:
    return
  if replace:
    shutil.rmtree(os.path.join(workdir, "checkpoints"), ignore_errors=True)
    for name in os.listdir(workdir):
      if name == "metrics.jsonl" or name.startswith("events.out"):
        os.remove(os.path.join(workdir, name))
  with open(os.path.join(workdir, "config.json"), "w") as f:
    f.write(config.to_json(indent=2))


def describe_data(data: pipeline.Dataset, seq_len: int) -> str:
  """One line of counts about the data (documents, instances, label balance, skipped input)."""
  src, train, ev = data.stats["source"], data.stats["train"], data.stats["eval"]
  if data.stats["format"] == "stream":  # XLNet's: windows of token streams, cut at load time (bertjax.data.plm)
    return (f"data: {src.documents} documents, {src.sentences} sentences; a token stream of train {train.tokens:,} and "
            f"eval {ev.tokens:,} tokens, read in windows of the reuse part {data.windows.reuse_len} on; tokenizer "
            f"{data.tokenizer.spec()}")
  line = (f"data: {src.documents} documents, {src.sentences} sentences; {data.stats['format']} instances: "
          f"train {train.instances} (label-1 share {train.label_balance:.3f}), eval {ev.instances}; "
          f"documents too short for a pair {train.too_short_documents}; tokenizer {data.tokenizer.spec()}")
  if data.stats["format"] == "electra":
    line += "; train " + instances.describe_electra(train)
  if data.stats["format"] == "sso":
    line += f"; train label-2 (other document) share {train.other_document / max(train.instances, 1):.3f}"
  if src.invalid_lines:
    line += f"; {src.invalid_lines} lines of invalid UTF-8 skipped"
  return line + "; " + describe_packing(train, seq_len)


def describe_packing(stats: instances.InstanceStats, seq_len: int) -> str:
  """"packing efficiency 97.1% (5,120 examples in 1,024 rows)": the share of the positions the model computes
  that hold real tokens (the rest is padding) in the prepared train rows."""
  efficiency = stats.tokens / max(1, stats.instances * seq_len)
  return f"packing efficiency {efficiency:.1%} ({stats.examples:,} examples in {stats.instances:,} rows)"


def describe_phase(phase: config_lib.Phase, count: int) -> str:
  """"phase 1/2: steps 0-900000 x batch 256 x seq_len 128, max_predictions 20" (the recipe of one phase)."""
  c = phase.config
  return (f"phase {phase.index + 1}/{count}: steps {phase.start}-{phase.end} x batch {c.batch_size} x seq_len "
          f"{c.seq_len}, max_predictions {config_lib.max_predictions(c)}")


def global_batch(host_batch: dict, sharding_) -> dict:
  """This host's rows -> global jax.Arrays split over (data, fsdp): no host holds the global batch."""
  return {k: jax.make_array_from_process_local_data(sharding_, v) for k, v in host_batch.items()}


class _Preemption:
  """Notes SIGTERM (a preempted VM, `kill`, a scheduler) so the loop can save and exit cleanly.

  Only in a one-process run: with several, each process may see its SIGTERM at another step, and one
  saving (a collective) while another trains would deadlock. There jax.distributed's preemption notifier
  keeps SIGTERM, and its sync point (`reached_preemption`) names one step at which every process saves."""

  def __init__(self):
    self.requested = False
    if jax.process_count() > 1:
      return
    try:
      signal.signal(signal.SIGTERM, self._handle)
    except ValueError:  # not the main thread (e.g. inside a notebook worker): no handler
      pass

  def _handle(self, signum, frame):
    self.requested = True


def train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, overridden=()):
  """Pretrains as the config says, writing metrics, TensorBoard events and checkpoints to workdir.

  `overridden`: the config keys set on the command line; with `init_from=hf:DIR` the checkpoint decides
  the architecture, and such a key that disagrees with it is an error (bertjax.hf.init_from).
  The SIGTERM handler it installs for the run is undone on return, so a caller (a notebook, a test) keeps
  a clean process."""
  old_handler = signal.getsignal(signal.SIGTERM)
  try:
    source = _init_source(config.init_from)
    with contextlib.ExitStack() as held:  # the workdir's lock, released however the run ends
      return _train_and_evaluate(source.resolve(config, overridden) if source else config, workdir, held)
  finally:
    try:
      signal.signal(signal.SIGTERM, old_handler)
    except ValueError:  # not the main thread
      pass


def _train_and_evaluate(config: ml_collections.ConfigDict, workdir: str, held: contextlib.ExitStack):
  # ---------------------------------------------------------------- Setup
  build.validate(config)
  config = resumed_config(config, workdir)  # a run saved before a switch existed resumes as it ran
  replace = check_workdir(config, workdir)
  plan = config_lib.phases(config)
  n_proc, proc = jax.process_count(), jax.process_index()
  mesh = sharding.make_mesh(config.sharding, overrides=dict(config.mesh))
  n_dev = jax.device_count()
  attention = build.attention_notice(config, mesh)  # a kernel this platform cannot run fails now
  for phase in plan:
    batch, name = phase.config.batch_size, "batch_size" if len(plan) == 1 else f"phases[{phase.index}].batch_size"
    micro = batch // config.grad_accum_steps
    if batch % n_dev or micro % n_dev or batch % n_proc:
      raise UserError(f"{name}={batch} (microbatch {micro}) is not divisible by the {n_dev} devices of {n_proc} "
                      f"processes; use a multiple of {n_dev * config.grad_accum_steps}")
    eval_bs = config.eval_batch_size or batch
    if eval_bs % n_dev:
      raise UserError(f"eval_batch_size={eval_bs} is not divisible by the {n_dev} devices; use a multiple of {n_dev}")
  allreduce_s = runtime.startup_check(mesh, config.startup_timeout)

  # ---------------------------------------------------------------- Data (every phase's: a bad input fails now)
  t0 = time.time()
  # One process prepares a cache entry (process 0 where the cache is shared), the others wait for it.
  datasets = {seq_len: pipeline.build(c, proc) for seq_len, c in config_lib.configs_by_seq_len(config).items()}
  if os.environ.get("BERTJAX_TRACE_ROWS"):  # debug: log the rows this process reads (tests/test_multihost.py)
    datasets = {k: pipeline.traced(d, os.environ["BERTJAX_TRACE_ROWS"], proc) for k, d in datasets.items()}
  tok = datasets[plan[0].config.seq_len].tokenizer
  # The corpus unigram counts, for masking.replace_dist=unigram or masking.smoothing (the first phase's data:
  # every phase reads the same text).
  counts = pipeline.corpus_token_counts(datasets[plan[0].config.seq_len], config.model.vocab_size) \
      if masking.needs_counts(config) else None
  if len({d.tokenizer.fingerprint for d in datasets.values()}) > 1:
    raise UserError("the phases' data were made with different tokenizers; prepare them with one "
                    "(python -m bertjax.data.prepare with the phased config writes every seq_len with the same)")
  # One writer per workdir: a second run stops here, naming the first, before it writes anything (and a run
  # whose input is bad, stopped above, has not touched the workdir at all).
  if proc == 0 and "://" not in workdir:
    held.enter_context(checkpoint.WorkdirLock(workdir))
  claim_workdir(config, workdir, replace)  # only now: a bad input must leave an existing workdir as it was
  writer = MetricWriter(workdir, enabled=proc == 0)
  for seq_len, data in datasets.items():
    writer.info(describe_data(data, seq_len) + (f" (seq_len {seq_len})" if len(datasets) > 1 else "") +
                f" [{time.time() - t0:.1f}s]")
  writer.info(f"processes {n_proc}, devices {n_dev} ({jax.devices()[0].platform}), mesh {dict(mesh.shape)}, "
              f"preset {config.sharding}; " + "; ".join(
                  f"{describe_phase(p, len(plan))}: batch per host {p.config.batch_size // n_proc}, per device "
                  f"{p.config.batch_size // n_dev}" for p in plan) + f"; all-reduce self-test {allreduce_s:.2f}s")

  writer.info(attention)

  # ---------------------------------------------------------------- State
  # Resume order: (1) the latest checkpoint in workdir (same run, exact), (2) weights from
  # config.init_from (a new run: fresh optimizer, step 0), (3) a fresh initialization.
  ckpt = checkpoint.Checkpointer(workdir, keep=config.keep_checkpoints)
  start = ckpt.latest_step() or 0
  current = config_lib.phase_at(config, start)
  # The phase's shapes; the state is every phase's, held in the steps' layout (split per layer where every layer
  # runs unrolled: build.make_steps), stacked for everything outside the steps (checkpoints, init_from, the caller).
  steps = build.make_steps(current.config, mesh, tok.special, counts, split=True)
  if ckpt.latest_step() is not None:
    state = steps.to_step(ckpt.restore(steps.stored_state))
    writer.info(f"resumed from {ckpt.directory} at step {int(state.step)}")
  else:
    state = steps.init(jax.random.key(config.seed))
    if config.init_from:  # a bertjax workdir, or a published checkpoint (hf:DIR): what it lacks stays fresh
      stored = steps.stored(state)
      params, report = load_init_params(config, stored.params)
      state = steps.to_step(dataclasses.replace(stored, params=params))
      for line in report:
        writer.info(line)
  man = manifest(config, tok, mesh, steps.model)
  n_params = sum(x.size for x in jax.tree.leaves(state.params))
  peak = flops.peak_flops(jax.devices()[0]) * n_dev
  writer.info(f"model: {n_params:,} parameters")

  def evaluate(step: int, phase: config_lib.Phase, data: pipeline.Dataset):
    sums = None
    eval_bs = config.eval_batch_size or phase.config.batch_size
    for i, host in enumerate(data.eval_batches(eval_bs, proc, n_proc)):
      m = steps.eval(state.params, global_batch(host, steps.batch_sharding), jnp.int32(i))
      sums = m if sums is None else sum_metrics(sums, m)
    writer.write(step, {f"eval/{k}": v for k, v in finalize(jax.device_get(sums)).items()})

  def save(step: int):
    ckpt.save(step, steps.stored(state), man, force=True)

  # ---------------------------------------------------------------- Train, phase by phase
  if config.init_from and start == 0:  # the starting point's eval (step 0): what continued training changes
    evaluate(0, current, datasets[current.config.seq_len])
  preemption = _Preemption()
  t_start = time.time()
  bad_in_a_row, prev_skipped = 0, None
  beacon = runtime.ProgressBeacon()  # multi-process: which peer a timed-out collective waited for
  step = start
  try:
    for phase in plan[current.index:]:
      pc = phase.config
      if phase is not current:  # new shapes: the steps are rebuilt (and recompiled) for them
        steps, current = build.make_steps(pc, mesh, tok.special, counts, split=True), phase
      data = datasets[pc.seq_len]
      tokens_per_step = pc.batch_size * pc.seq_len
      flops_per_token = flops.model_train_flops_per_token(
          steps.model, pc.seq_len, steps.cfg.masking.max_predictions, steps.cfg.masking.max_shuffled)
      writer.info(f"{describe_phase(phase, len(plan))}; {flops_per_token / 1e6:.1f} MFLOPs/token (train)")
      pending, t_log, step_log = [], time.time(), max(start, phase.start)
      real = 0  # this host's real (non-padding) tokens since the last log: packing efficiency
      for step in range(max(start, phase.start), phase.end):
        beacon.step = step
        host = data.train_batch(step - phase.start, pc.batch_size, config.seed, proc, n_proc)
        real += int(np.count_nonzero(host["groups"]))
        state, metrics = steps.train(state, global_batch(host, steps.batch_sharding))
        pending.append(metrics)  # stays on device until the next log (fetching every step halves speed)
        done = step + 1
        # Non-finite guard: read the previous step's flag (already computed, so no pipeline stall).
        if prev_skipped is not None:
          bad_in_a_row = bad_in_a_row + 1 if float(prev_skipped) > 0 else 0
        prev_skipped = metrics["skipped"].value
        if bad_in_a_row >= config.max_nonfinite_steps:
          save(done)
          ckpt.close()
          raise UserError(f"stopped at step {done}: {bad_in_a_row} steps in a row had a non-finite loss or gradient "
                          f"norm (updates skipped; the last good state is saved in {ckpt.directory}); lower the "
                          "learning rate, check the data, or use float32")
        last = done == phase.end  # a phase ends with a log, an eval and a checkpoint (resume at the boundary)
        if done % config.log_every == 0 or last:
          summed = functools.reduce(sum_metrics, pending)
          values = {f"train/{k}": v for k, v in finalize(jax.device_get(summed)).items()}  # skipped: a Sum
          dt = time.time() - t_log
          values["lr"] = float(steps.schedule(done - 1))
          values["tokens_per_sec"] = (done - step_log) * tokens_per_step / dt
          # Real tokens / computed positions in this host's rows since the last log (the processes read
          # equal shares of the same shuffled rows, so one host's share stands for the batch's).
          values["packing_efficiency"] = real * n_proc / ((done - step_log) * tokens_per_step)
          values["real_tokens_per_sec"] = values["tokens_per_sec"] * values["packing_efficiency"]
          if peak:
            values["mfu"] = values["tokens_per_sec"] * flops_per_token / peak
          values["phase"], values["seq_len"] = phase.index + 1, pc.seq_len
          writer.write(done, values)
          writer.progress(done, config.total_steps, values, time.time() - t_start, done - start)
          pending, t_log, step_log, real = [], time.time(), done, 0
        if done % config.eval_every == 0 or last:
          evaluate(done, phase, data)
        if done % config.checkpoint_every == 0 or last:
          save(done)
        # SIGTERM here, or another host's (jax's multi-host preemption sync point, via orbax): save and stop.
        if preemption.requested or ckpt.manager.reached_preemption(done):
          if done % config.checkpoint_every and not last:
            save(done)
          ckpt.close()
          writer.info(f"preempted: saved step {done} in {ckpt.directory}; run the same command to resume")
          writer.close()
          return steps.stored(state)
    ckpt.close()  # the last async save lands (or fails) here, inside the handler below
  except Exception as e:
    full = checkpoint.is_disk_full(e)
    if full:
      checkpoint.quiet_disk_full_noise().noticed()  # late "Event loop is closed" echoes of the failed writes: noise
      latest = supervisor.last_checkpoint([f"--workdir={workdir}"])
      raise UserError(f"the disk is full: a checkpoint write in {ckpt.directory} failed ({full}, "
                      f"noticed at step {step + 1});"
                      f"{latest} free space (or lower --config.keep_checkpoints) and run the same command to "
                      "resume") from None
    if n_proc > 1 and runtime.is_collective_timeout(e):  # XLA:CPU's collective timeout (bertjax.core.runtime)
      raise RestartableError(
          f"at step {step + 1}: a collective waited more than {runtime.configured_timeout():.0f}s "
          f"(--config.runtime.step_timeout_s) for {beacon.suspects()} of {n_proc}, which stopped or hangs, so "
          f"process {proc} stopped;{supervisor.last_checkpoint([f'--workdir={workdir}'])} start the job again (the same "
          "command on every process) to resume") from None
    raise
  finally:
    beacon.close()
  writer.close()
  return steps.stored(state)
