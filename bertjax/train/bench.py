"""`python -m bertjax.train.bench --config=... [--batch_size=N] [--steps=N]`: compile and time the real train step.

Prints one JSON object: `tokens_per_sec`, `step_seconds` (median of `--steps` timed steps after
`--warmup` untimed ones), `compile_seconds` (trace + lower + XLA compile), `model_flops_per_token` (the
analytic count `summary` prints), `mfu` and `peak_memory_bytes`. MFU is measured against the device's
peak from `bertjax.model.flops.PEAK_FLOPS`; a CPU has no published peak, so there the denominator is a
2048^3 matmul in the compute dtype timed between the timed steps (`MatmulProbe`): what a dense kernel
does on this machine under the same load. On CPU, peak memory is XLA's estimate for the step.

The step is `bertjax.train.step.train_step` jitted as the loop jits it (shardings from the model's logical
axes, donated state), on a synthetic batch of the configured shape: [CLS] A [SEP] B [SEP] pairs of random
non-special ids filling the whole sequence, so the masking, model, objectives and optimizer all run.
The library functions here are what benchmarks/*.py reuse.
"""

import dataclasses
import json
import os
import resource
import statistics
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import jax
import jax.numpy as jnp
import numpy as np
from absl import flags

from bertjax.core import config as config_lib, runtime, sharding
from bertjax.core.cli import cli, config_and_phase_flags, run
from bertjax.core.errors import UserError
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
  return dict(
      input_ids=ids,
      type_ids=(np.arange(s)[None] > split[:, None]).astype(np.int32),
      word_start=rng.random((batch_size, s)) < 0.7,
      groups=np.ones((batch_size, s), np.int32),
      sentence_label=rng.integers(0, 2, batch_size, dtype=np.int32),
      example_weight=np.ones(batch_size, np.float32),
  )


def setup(config, batch_size: int = 0) -> Bench:
  """The loop's jitted steps for `config` at a global batch of `batch_size` (0: the config's)."""
  config = config.copy_and_resolve_references()
  config.batch_size = batch_size or config.batch_size
  build.validate(config)
  n_dev = jax.device_count()
  if config.batch_size % (n_dev * config.grad_accum_steps):
    multiple = n_dev * config.grad_accum_steps
    raise UserError(f"batch_size={config.batch_size} is not divisible by the {n_dev} devices "
                    f"(x grad_accum_steps={config.grad_accum_steps}); use a multiple of {multiple}")
  mesh = sharding.make_mesh(config.sharding, overrides=dict(config.mesh))
  steps = build.make_steps(config, mesh, SPM_SPECIAL, build.placeholder_counts(config))
  batch = jax.device_put(synthetic_batch(config, config.batch_size), steps.batch_sharding)
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


def _define_flags():
  """The CLI's flags, defined only when run as a program (so `import bertjax.train.bench` defines none)."""
  config = config_and_phase_flags("configs/bert.py:base", "time")
  batch = flags.DEFINE_integer("batch_size", 0, "global batch size (0: the config's)")
  steps = flags.DEFINE_integer("steps", 10, "timed steps (the median is reported)")
  warmup = flags.DEFINE_integer("warmup", 2, "untimed steps after compilation")
  return config, batch, steps, warmup


@cli
def main(argv):
  del argv
  runtime.setup()
  config, batch, steps, warmup = _FLAGS
  print(json.dumps(measure(config(), batch.value, steps.value, warmup.value)), flush=True)


if __name__ == "__main__":
  _FLAGS = _define_flags()
  run(main)
