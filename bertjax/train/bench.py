"""`python -m bertjax.train.bench --config=... [--batch_size=N] [--steps=N] [--census]`: compile and time the real
train step.

Prints one JSON object: `tokens_per_sec`, `step_seconds` (median of `--steps` timed steps after
`--warmup` untimed ones), `compile_seconds` (trace + lower + XLA compile), `model_flops_per_token` (the
analytic count `summary` prints), `mfu` and `peak_memory_bytes`. MFU is measured against the device's
peak from `bertjax.model.flops.PEAK_FLOPS`; a CPU has no published peak, so there the denominator is a
2048^3 matmul in the compute dtype timed between the timed steps (`MatmulProbe`): what a dense kernel
does on this machine under the same load. On CPU, peak memory is XLA's estimate for the step.

The step is `bertjax.train.step.train_step` jitted as the loop jits it (shardings from the model's logical
axes, donated state), on a synthetic batch of the configured shape: [CLS] A [SEP] B [SEP] pairs of random
non-special ids filling the whole sequence, so the masking, model, objectives and optimizer all run.
`--census` compiles only and prints, instead, which library runs each matmul of the step (YNNPACK, oneDNN,
Eigen: `bertjax.train.census`), a table on stderr and the census as one JSON object on stdout.
The library functions here are what benchmarks/*.py reuse (`StepProcess`: a step compiled under its own XLA
flags in a process of its own, for settings timed side by side).
"""

import dataclasses
import json
import os
import resource
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from bertjax.core import config as config_lib, runtime, sharding
from bertjax.core.cli import cli, config_and_phase_flags, run
from bertjax.core.errors import UserError
from bertjax.data import plm
from bertjax.data.tokenizer import SPM_SPECIAL
from bertjax.model import flops
from bertjax.train import build


@dataclasses.dataclass
class Bench:
  """The loop's jitted train step for one config, with a batch to feed it."""

  steps: build.Steps  # init, train, abstract_state, ...
  batch: dict  # device arrays of one global batch
  batch_size: int
  seq_len: int
  flops_per_token: float


def synthetic_batch(config, batch_size: int, seed: int = 0) -> dict:
  """A host batch shaped like the loader's: full-length [CLS] A [SEP] B [SEP] rows of random
  non-special ids (special ids of bertjax's own SentencePiece layout)."""
  sp = SPM_SPECIAL
  s = config.seq_len
  rng = np.random.default_rng(seed)
  ids = rng.integers(max(dataclasses.astuple(sp)) + 1, config.model.vocab_size, (batch_size, s), dtype=np.int32)
  split = rng.integers(2, s - 2, batch_size)  # the [SEP] that ends A
  ids[:, 0], ids[:, -1] = sp.cls, sp.sep
  ids[np.arange(batch_size), split] = sp.sep
  batch = dict(
      input_ids=ids,
      type_ids=(np.arange(s)[None] > split[:, None]).astype(np.int32),
      word_start=rng.random((batch_size, s)) < 0.7,
      groups=np.ones((batch_size, s), np.int32),
      sentence_label=rng.integers(0, 2, batch_size, dtype=np.int32),
      example_weight=np.ones(batch_size, np.float32),
  )
  if "plm" in config_lib.active_objectives(config):  # XLNet's targets and factorization orders (bertjax.data.plm)
    r, p = plm.reuse_len(config), plm.perm_size(config)
    batch["plm_masked"] = np.zeros((batch_size, s), bool)
    for row in batch["plm_masked"]:
      row[rng.choice(s - 1, plm.num_predict(config), replace=False)] = True
    batch["perm_rank"] = np.stack([np.concatenate([plm.local_perm(rng, r, p), plm.local_perm(rng, s - r, p)])
                                   for _ in range(batch_size)])
  return batch


def setup(config, batch_size: int = 0, batch: dict | None = None) -> Bench:
  """The loop's jitted steps for `config` at a global batch of `batch_size` (0: the config's), fed `batch` (a
  host batch of that shape, e.g. packed rows with position_ids) or else `synthetic_batch`."""
  config = config.copy_and_resolve_references()
  config.batch_size = batch_size or config.batch_size
  build.validate(config)
  n_dev = jax.device_count()
  if config.batch_size % (n_dev * config.grad_accum_steps):
    multiple = n_dev * config.grad_accum_steps
    raise UserError(f"batch_size={config.batch_size} is not divisible by the {n_dev} devices "
                    f"(x grad_accum_steps={config.grad_accum_steps}); use a multiple of {multiple}")
  mesh = sharding.make_mesh(config.sharding, overrides=dict(config.mesh))
  steps = build.make_steps(config, mesh, SPM_SPECIAL, build.placeholder_counts(config), split=True)  # the loop's layout
  batch = synthetic_batch(config, config.batch_size) if batch is None else batch
  batch = jax.device_put(batch, steps.batch_sharding)
  fpt = flops.model_train_flops_per_token(steps.model, config.seq_len, steps.cfg.masking.max_predictions,
                                          steps.cfg.masking.max_shuffled)
  return Bench(steps, batch, config.batch_size, config.seq_len, fpt)


def compile_step(bench: Bench):
  """(compiled train step, seconds to trace, lower and compile it); no state is allocated."""
  t0 = time.perf_counter()
  compiled = bench.steps.train.lower(bench.steps.abstract_state, bench.batch).compile()
  return compiled, time.perf_counter() - t0


def time_steps(compiled, state, batch, steps: int, warmup: int, between=None):
  """Runs warmup + steps steps, each waited for; returns (final state, the timed steps' seconds).
  `between()`, if given, runs after each timed step (outside its timing)."""
  times = []
  for i in range(warmup + steps):
    t0 = time.perf_counter()
    state, metrics = compiled(state, batch)
    jax.block_until_ready((state, metrics))
    if i >= warmup:
      times.append(time.perf_counter() - t0)
      if between is not None:
        between()
  return state, times


class MatmulProbe:
  """Times an n^3 matmul in a dtype on the default device, a few runs at a time: sampled between the
  timed train steps, it sees the same machine load as they do (CPUs shared with other work)."""

  def __init__(self, dtype=jnp.float32, n: int = 2048):
    self.n, self.times = n, []
    self._a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32).astype(dtype)
    self._b = jax.random.normal(jax.random.key(1), (n, n), jnp.float32).astype(dtype)
    self._mm = jax.jit(lambda x, y: x @ y)
    self._mm(self._a, self._b).block_until_ready()  # compile

  def sample(self, repeats: int = 3):
    for _ in range(repeats):
      t0 = time.perf_counter()
      self._mm(self._a, self._b).block_until_ready()
      self.times.append(time.perf_counter() - t0)

  def flops_per_sec(self) -> float:
    """FLOP/s at the median of the timed runs."""
    return 2.0 * self.n**3 / statistics.median(self.times)


def matmul_peak(dtype=jnp.float32, n: int = 2048, repeats: int = 10) -> float:
  """FLOP/s of an n^3 matmul on the default device: the median of `repeats` timed runs."""
  probe = MatmulProbe(dtype, n)
  probe.sample(repeats)
  return probe.flops_per_sec()


def peak_memory(compiled) -> tuple:
  """(bytes, source): the device's peak if it reports one, else XLA's estimate for the step
  (arguments + outputs - aliased + temporaries)."""
  stats = jax.devices()[0].memory_stats() or {}
  if "peak_bytes_in_use" in stats:
    return int(stats["peak_bytes_in_use"]), "device"
  m = compiled.memory_analysis()
  if m is None:
    return 0, "unknown"
  total = m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes + m.temp_size_in_bytes
  return int(total), "xla_estimate"


def measure(config, batch_size: int = 0, steps: int = 10, warmup: int = 2, peak: float = 0.0) -> dict:
  """Compiles and times the config's train step; the dict the CLI prints as JSON.

  `peak` (FLOP/s of all devices) overrides the peak MFU is measured against. Without it, a device
  listed in `flops.PEAK_FLOPS` uses its published peak; otherwise (CPU) a 2048^3 matmul in the compute
  dtype is timed three times after each timed step and its median rate is the peak.
  """
  if steps < 1 or warmup < 0:
    raise UserError(f"steps={steps}, warmup={warmup}: time at least one step (--steps >= 1, --warmup >= 0)")
  device = jax.devices()[0]
  peak_source = "given" if peak else "table"
  peak = peak or flops.peak_flops(device) * jax.device_count()
  probe = None if peak else MatmulProbe(config_lib.DTYPES[config.model.dtype])
  bench = setup(config, batch_size)
  compiled, compile_seconds = compile_step(bench)
  state = bench.steps.init(jax.random.key(config.seed))
  state, times = time_steps(compiled, state, bench.batch, steps, warmup, probe and probe.sample)
  del state
  if probe is not None:
    peak, peak_source = probe.flops_per_sec() * jax.device_count(), "measured_matmul_2048"
  step_seconds = statistics.median(times)
  tokens_per_sec = bench.batch_size * bench.seq_len / step_seconds
  mem, mem_source = peak_memory(compiled)
  return dict(
      tokens_per_sec=tokens_per_sec,
      step_seconds=step_seconds,
      compile_seconds=compile_seconds,
      model_flops_per_token=bench.flops_per_token,
      mfu=tokens_per_sec * bench.flops_per_token / peak,
      peak_memory_bytes=mem,
      peak_memory_source=mem_source,
      host_peak_rss_bytes=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
      peak_flops=peak,
      peak_flops_source=peak_source,
      batch_size=bench.batch_size,
      seq_len=bench.seq_len,
      dtype=config.model.dtype,
      steps=steps,
      warmup=warmup,
      step_seconds_min=min(times),
      step_seconds_max=max(times),
      device=device.device_kind,
      device_count=jax.device_count(),
  )


class Job:
  """A compiled step to time, as `StepProcess` workers build them: `run(state) -> state` (waits for the
  result), a starting state, tokens per step, compile seconds, the optimized HLO and `scalars(state)`: the
  numbers compared across settings for numerics (loss and gradient norm of the last step)."""

  def __init__(self, run, state, tokens: int, compile_seconds: float, hlo: str, scalars, peak_memory: int = 0,
               flops_per_token: float = 0.0):
    self.run, self.state, self.tokens, self.compile_seconds, self.hlo, self.scalars = (
        run, state, tokens, compile_seconds, hlo, scalars)
    self.peak_memory = peak_memory  # bytes (bench.peak_memory), 0 if unknown
    self.flops_per_token = flops_per_token  # analytic training FLOPs per token (Bench.flops_per_token)


def pretrain_job(config, batch_size: int = 0, batch: dict | None = None) -> Job:
  """The loop's train step for `config` (`setup`, on `batch` if given), as a Job: its scalars are the step's loss
  and grad_norm."""
  from bertjax.core import metrics as metrics_lib

  bench = setup(config, batch_size, batch)
  compiled, seconds = compile_step(bench)
  out = {}

  def run(state):
    state, out["metrics"] = compiled(state, bench.batch)
    jax.block_until_ready((state, out["metrics"]))
    return state

  def scalars(_):
    m = metrics_lib.finalize(jax.device_get(out["metrics"]))
    return dict(loss=float(m["loss"]), grad_norm=float(m["grad_norm"]))

  return Job(run, bench.steps.init(jax.random.key(config.seed)), bench.batch_size * bench.seq_len, seconds,
             compiled.as_text(), scalars, peak_memory(compiled)[0], bench.flops_per_token)


def _step_worker(conn, make, args):
  """A StepProcess's body: builds `make(*args)` (a Job) under the XLA flags its environment carries, then
  answers ("steps", n) with n step times and ("scalars",) with the numerics, until ("close",)."""
  runtime.setup()
  from bertjax.train import census

  job = make(*args)
  state = job.run(job.state)  # the first step from the common start: its numbers are the numerics check
  first = job.scalars(state)
  conn.send(dict(compile_seconds=job.compile_seconds, census=census.census(job.hlo), first_step=first,
                 tokens=job.tokens, xla_flags=os.environ.get("XLA_FLAGS", ""), peak_memory_bytes=job.peak_memory))
  while (msg := conn.recv())[0] != "close":
    times, cpu0 = [], time.process_time()
    for _ in range(msg[1]):
      t0 = time.perf_counter()
      state = job.run(state)
      times.append(time.perf_counter() - t0)
    conn.send((times, time.process_time() - cpu0))


class StepProcess:
  """A Job built and timed in a process of its own, started with `env` added to the environment (XLA reads
  XLA_FLAGS once, when its CPU backend starts: each setting of the flags needs its own process). Several
  of them alternate `steps(n)` calls so that every setting sees the same machine load."""

  def __init__(self, make, args: tuple, env: dict):
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    self.conn, child = ctx.Pipe()
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
      self.proc = ctx.Process(target=_step_worker, args=(child, make, args), daemon=True)
      self.proc.start()
    finally:
      for k, v in saved.items():
        if v is None:
          os.environ.pop(k, None)
        else:
          os.environ[k] = v
    self.info = self.conn.recv()
    self.cpu_seconds, self.cpu_steps = 0.0, 0  # CPU time of the process's timed steps (all its threads)

  def steps(self, n: int) -> list:
    """n steps' wall times; their CPU time adds to `cpu_seconds` (less sensitive to other jobs' load)."""
    self.conn.send(("steps", n))
    times, cpu = self.conn.recv()
    self.cpu_seconds, self.cpu_steps = self.cpu_seconds + cpu, self.cpu_steps + n
    return times

  def close(self):
    self.conn.send(("close",))
    self.proc.join()


def _define_flags():
  """The CLI's flags, defined only when run as a program (so `import bertjax.train.bench` defines none)."""
  config = config_and_phase_flags("configs/bert.py:base", "time")
  batch = flags.DEFINE_integer("batch_size", 0, "global batch size (0: the config's)")
  steps = flags.DEFINE_integer("steps", 10, "timed steps (the median is reported)")
  warmup = flags.DEFINE_integer("warmup", 2, "untimed steps after compilation")
  census = flags.DEFINE_bool("census", False, "compile only, and print which library runs each matmul "
                             "(bertjax.train.census: dots and FLOPs per library) instead of timing steps")
  return config, batch, steps, warmup, census


def census_of(config, batch_size: int = 0) -> dict:
  """The dot census (bertjax.train.census) of the config's compiled train step, with the XLA flags in force."""
  from bertjax.train import census

  bench = setup(config, batch_size)
  compiled, seconds = compile_step(bench)
  return dict(census.of_compiled(compiled), compile_seconds=seconds, batch_size=bench.batch_size,
              seq_len=bench.seq_len, xla_flags=os.environ.get("XLA_FLAGS", ""))


@cli
def main(argv):
  del argv
  runtime.setup()
  config, batch, steps, warmup, census = _FLAGS
  if census.value:
    from bertjax.train.census import format_census

    result = census_of(config(), batch.value)
    print(format_census(result, f"dot census of the train step, batch {result['batch_size']} x {result['seq_len']}, "
                                f"XLA_FLAGS={result['xla_flags']!r}"), file=sys.stderr, flush=True)
    print(json.dumps(result), flush=True)
    return
  print(json.dumps(measure(config(), batch.value, steps.value, warmup.value)), flush=True)


if __name__ == "__main__":
  _FLAGS = _define_flags()
  run(main)
