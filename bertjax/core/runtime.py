"""Process setup, called explicitly by every entry point before JAX runs anything: `setup()`.

Importing bertjax (or any of its modules) has no side effects; an entry point (`python -m bertjax.train`,
the other CLIs, the notebook, the tests' conftest) calls `setup()` once, first. It
- joins a multi-process job when the environment describes one (`jax.distributed.initialize()`),
- makes random bits partitionable (no cross-device traffic to generate them),
and, only where JAX will run on this host's CPU:
- In a multi-process job, bound how long a collective waits for its peers (XLA:CPU's own collective
  timeout, from config.runtime.step_timeout_s: `step_timeout`, `collective_timeout_flags`); the loop turns
  a timed-out collective into one line naming the step and the stalled peer (`ProgressBeacon`), exit 75.
- With libtpu installed (it compiles for TPU topologies in `bertjax.aot`) but no TPU chip here, pin JAX
  to the CPU up front so libtpu does not print its warnings in every process.
- Keep freed host memory for reuse (`retain_host_memory`): XLA's CPU runtime mallocs each execution's
  temporary buffers as one block (160 MB for a BERT-tiny train step, 1.3 GB for BERT-base at batch 8)
  and frees it when the step ends. glibc serves a block that large with mmap and hands it back with
  munmap, so every step page-faults its whole working set anew: a sixth of a tiny step on two cores.
  Opt in with `BERTJAX_HOST_MALLOC=retain`: one heap for all threads also serializes XLA's compiler
  threads on its lock (a BERT-tiny train step compiles in ~7 s instead of ~4.7), so it pays off only for
  runs of more than a few hundred steps, and is off by default.
"""

import ctypes
import importlib.util
import os
import platform

# glibc mallopt(3) parameters.
_M_TRIM_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -4, -8


def _tpu_chips() -> int:
  from jax._src import hardware_utils

  return hardware_utils.num_available_tpu_chips_and_device_id()[0]


def _chosen_platform() -> str | None:
  import jax

  return os.environ.get("JAX_PLATFORMS") or jax.config.jax_platforms


def _falls_back_to_cpu() -> bool:
  """With no platform chosen, whether JAX ends up on the CPU: no PJRT plugin (GPU), and no libtpu or no
  TPU chip for it."""
  if importlib.util.find_spec("jax_plugins") is not None:
    return False
  return importlib.util.find_spec("libtpu") is None or _tpu_chips() == 0


def runs_on_cpu() -> bool:
  """Whether JAX will pick the CPU backend, judged without starting one."""
  chosen = _chosen_platform()
  return chosen.split(",")[0] == "cpu" if chosen else _falls_back_to_cpu()


def _cpu_when_libtpu_has_no_tpu():
  """JAX would try libtpu's backend first, warn, and fall back to the CPU: say "cpu" up front when
  nothing chose the platform, libtpu is installed and JAX would fall back to the CPU anyway."""
  if _chosen_platform() is None and importlib.util.find_spec("libtpu") is not None and _falls_back_to_cpu():
    import jax

    jax.config.update("jax_platforms", "cpu")


def retain_host_memory() -> bool:
  """Ask glibc to serve every thread from its main heap (M_ARENA_MAX=1), never to mmap (M_MMAP_MAX=0;
  per-thread arenas would mmap any block over 64 MB regardless) and to keep up to 2 GiB of freed memory
  instead of trimming it (M_TRIM_THRESHOLD). Each step then reuses the pages of the step before: no page
  faults, no munmap. Must run before JAX starts its worker threads, which pick their arena on their first
  malloc. The cost is resident memory: a freed block is reused, not returned (peak RSS of a BERT-base
  CPU run grows by about 40%). Returns whether glibc accepted all three; False off glibc."""
  if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
    return False
  try:
    mallopt = ctypes.CDLL(None).mallopt
  except (OSError, AttributeError):
    return False
  settings = ((_M_ARENA_MAX, 1), (_M_MMAP_MAX, 0), (_M_TRIM_THRESHOLD, 2**31 - 1))
  return all([mallopt(param, value) == 1 for param, value in settings])  # a list: apply all three


def multi_process_env() -> bool:
  """Whether the environment describes a job of several processes (launch/, or a TPU pod slice)."""
  return int(os.environ.get("JAX_NUM_PROCESSES", "1")) > 1 or "," in os.environ.get("TPU_WORKER_HOSTNAMES", "")


def join_job(join_timeout_s: float = 300.0, heartbeat_timeout_s: float = 100.0):
  """Joins a multi-process job when the environment describes one.

  On TPU pod slices `jax.distributed.initialize()` finds everything itself; elsewhere (multi-GPU,
  SLURM, `launch/gpu_multinode.sh --local`) JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID
  name the job. A process that cannot reach the others within `join_timeout_s` stops with a UserError;
  once joined, a process that stops sending heartbeats for `heartbeat_timeout_s` is declared lost and
  jax.distributed ends every other process (bertjax.core.supervisor turns that into one line). On the CPU the
  processes' collectives go over gloo (TCP), jax's default `jax_cpu_collectives_implementation`.
  """
  import jax

  from bertjax.core.errors import UserError

  n = int(os.environ.get("JAX_NUM_PROCESSES", "1"))
  if not multi_process_env():
    return
  where = dict(coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"], num_processes=n,
               process_id=int(os.environ["JAX_PROCESS_ID"])) if n > 1 else {}
  try:
    jax.distributed.initialize(**where, initialization_timeout=max(1, int(join_timeout_s)),
                               heartbeat_timeout_seconds=max(1, int(heartbeat_timeout_s)))
  except Exception as e:  # jax raises its runtime errors (DEADLINE_EXCEEDED, UNAVAILABLE) with gRPC detail
    first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    raise UserError(f"could not join the job at {where.get('coordinator_address', 'the TPU coordinator')} as "
                    f"process {where.get('process_id', '?')} of {n} within {join_timeout_s:.0f}s ({first}); start "
                    "the same command on every host, process 0 first reachable at JAX_COORDINATOR_ADDRESS") from None


_DONE = []
_COLLECTIVE_TIMEOUT_FLAG = "--xla_cpu_collective_timeout_seconds"
MIN_SCALED_TIMEOUT_S = 300.0  # a scaled timeout never goes below this: peers' compile times differ too
_STEPS_PER_TIMEOUT = 50  # a scaled timeout is this many measured steps


def step_timeout(config, workdir: str | None) -> float:
  """How long a collective may wait for its peers: config.runtime.step_timeout_s, scaled down on a
  restarted run to _STEPS_PER_TIMEOUT x the step time its earlier attempt measured (the last logged
  tokens_per_sec in workdir/metrics.jsonl, which excludes compilation), never below MIN_SCALED_TIMEOUT_S.

  XLA fixes the timeout when it compiles a step, so it is chosen once per process, before JAX starts; a
  first attempt keeps the configured (generous) value."""
  import json

  limit = float((config.get("runtime") or {}).get("step_timeout_s", 1200.0))
  path = os.path.join(workdir, "metrics.jsonl") if workdir and "://" not in workdir else ""
  rate = 0.0
  try:
    with open(path) as f:
      for line in f:
        rate = json.loads(line).get("tokens_per_sec", rate)
  except (OSError, ValueError):
    return limit
  tokens = config.get("batch_size", 0) * config.get("seq_len", 0)
  if rate <= 0 or not tokens:
    return limit
  return min(limit, max(MIN_SCALED_TIMEOUT_S, _STEPS_PER_TIMEOUT * tokens / rate))


def collective_timeout_flags(timeout_s: float) -> bool:
  """Puts XLA:CPU's collective timeout (`--xla_cpu_collective_timeout_seconds`) in XLA_FLAGS unless the user
  set one; before the backend starts, which is when XLA reads it. With it a gloo collective (the CPU
  collectives of multi-process runs) that waits longer for a peer fails with "Gloo ... Timed out" in the
  waiting process instead of blocking forever. Returns whether the flag is now set."""
  flags = os.environ.get("XLA_FLAGS", "")
  if _COLLECTIVE_TIMEOUT_FLAG not in flags:
    os.environ["XLA_FLAGS"] = f"{flags} {_COLLECTIVE_TIMEOUT_FLAG}={max(1, int(timeout_s))}".strip()
  return True


def configured_timeout() -> float:
  """The collective timeout XLA_FLAGS sets (collective_timeout_flags), in seconds; 0 if none."""
  import re

  m = re.search(rf"{_COLLECTIVE_TIMEOUT_FLAG}=(\d+)", os.environ.get("XLA_FLAGS", ""))
  return float(m.group(1)) if m else 0.0


# XLA:CPU flags bertjax sets by default on the CPU (`cpu_flags`), each unless the user's XLA_FLAGS names it;
# BERTJAX_CPU_FLAGS=off sets none. None yet: oneDNN for dots (--xla_cpu_use_onednn=true
# --xla_cpu_experimental_onednn_fusion_type=dot) takes every dot, but kills the process with SIGILL ("partition
# compile failed") on a batched dot with an elementwise operand (attention without dropout), so it is no default
# (docs/cpu.md). No threading flag either: XLA:CPU already splits every large loop fusion (GELU, LayerNorm, dropout,
# AdamW) into one partition per core of the process's CPU affinity, and no flag of jaxlib 0.10 changes that count
# (docs/cpu.md, "Both cores").
CPU_XLA_FLAGS = ()
CPU_FLAGS_ENV = "BERTJAX_CPU_FLAGS"  # "off": leave XLA's own CPU routing (YNNPACK, then Eigen)


def cpu_flags() -> list:
  """Adds CPU_XLA_FLAGS to XLA_FLAGS, each unless XLA_FLAGS already names it (the user's value wins), and none
  with BERTJAX_CPU_FLAGS=off. Only before the CPU backend starts, which is when XLA reads them. Returns the
  flags it added."""
  if os.environ.get(CPU_FLAGS_ENV, "").lower() in ("off", "0", "false", "none"):
    return []
  flags = os.environ.get("XLA_FLAGS", "")
  named = {f.split("=")[0] for f in flags.split()}
  added = [f"{name}={value}" for name, value in CPU_XLA_FLAGS if name not in named]
  if added:
    os.environ["XLA_FLAGS"] = " ".join([flags, *added]).strip()
  return added


def setup(join_timeout_s: float = 300.0, heartbeat_timeout_s: float = 100.0, step_timeout_s: float = 1200.0):
  """Platform choice, allocator policy, JAX flags and multi-host initialization (see join_job for the
  timeouts, which the training CLIs take from config.startup_timeout and config.heartbeat_timeout, and
  collective_timeout_flags for step_timeout_s, see step_timeout); once per process (a second call does nothing)."""
  if _DONE:
    return
  _DONE.append(True)
  _cpu_when_libtpu_has_no_tpu()
  if os.environ.get("BERTJAX_HOST_MALLOC", "default") == "retain" and runs_on_cpu():
    retain_host_memory()
  if multi_process_env() and runs_on_cpu():
    collective_timeout_flags(step_timeout_s)
  if runs_on_cpu():
    cpu_flags()
  import jax

  jax.config.update("jax_threefry_partitionable", True)  # random bits need no cross-device traffic
  join_job(join_timeout_s, heartbeat_timeout_s)


def startup_check(mesh, timeout_s: float = 300.0) -> float:
  """One all-reduce over every device of every process, with a clear message if it hangs.

  A multi-host job whose hosts cannot reach each other (wrong coordinator, a host that never started,
  a firewall) otherwise hangs silently in its first collective. Returns the seconds it took.
  """
  import threading
  import time

  import jax
  import numpy as np
  from jax.sharding import NamedSharding, PartitionSpec as P

  from bertjax.core.errors import UserError

  flat = jax.sharding.Mesh(np.asarray(mesh.devices).reshape(-1), ("all",))
  local = np.ones(len([d for d in flat.devices if d.process_index == jax.process_index()]), np.float32)
  result, start = {}, time.time()

  def run():
    try:
      x = jax.make_array_from_process_local_data(NamedSharding(flat, P("all")), local)
      result["sum"] = float(jax.jit(lambda v: v.sum(), out_shardings=NamedSharding(flat, P()))(x))
    except Exception as e:  # reported below, on the main thread
      result["error"] = e

  thread = threading.Thread(target=run, daemon=True)
  thread.start()
  thread.join(timeout_s)
  if thread.is_alive():
    raise UserError(f"the start-up all-reduce over {jax.device_count()} devices in {jax.process_count()} processes "
                    f"did not finish in {timeout_s:.0f}s: check that every host runs the same command and can reach "
                    "the coordinator (JAX_COORDINATOR_ADDRESS / TPU worker network)")
  if "error" in result:
    raise result["error"]
  if result["sum"] != jax.device_count():
    raise UserError(f"the start-up all-reduce gave {result['sum']}, expected {jax.device_count()}: devices disagree")
  return time.time() - start


# ---------------------------------------------------------------- a collective that waited too long

# What a collective that timed out raises: gloo's (XLA:CPU multi-process), and XLA's own deadline errors.
_TIMED_OUT = ("Timed out waiting", "DEADLINE_EXCEEDED", "timed out after")
_BEACON_KEY = "bertjax/progress/"


def is_collective_timeout(error: BaseException) -> bool:
  """Whether `error` is a collective that gave up waiting for a peer (see collective_timeout_flags)."""
  text = str(error)
  where = "Gloo" in text or "collective" in text.lower() or "barrier" in text.lower()
  return where and any(t in text for t in _TIMED_OUT)


class ProgressBeacon:
  """Publishes this process's step (and the time) in jax.distributed's key-value store every `every`
  seconds, from a daemon thread: when a collective times out, the peers' beacons tell which of them
  stopped (a stale time: stopped, hung or descheduled) or fell behind (a lower step). The training loop
  only sets `.step`, so the hot path does no I/O; nothing runs in a one-process run."""

  def __init__(self, every: float = 2.0):
    import threading

    import jax
    from jax._src import distributed

    self.step, self.every = 0, every
    self.process, self.count = jax.process_index(), jax.process_count()
    self._client = distributed.global_state.client
    self._stop = threading.Event()
    if self.count > 1 and self._client is not None:
      threading.Thread(target=self._run, daemon=True, name="bertjax-progress").start()

  def _run(self):
    import time

    while not self._stop.wait(self.every):
      try:
        self._client.key_value_set(f"{_BEACON_KEY}{self.process}", f"{self.step} {time.time():.1f}",
                                   allow_overwrite=True)
      except Exception:  # the coordinator is gone: jax.distributed reports that itself
        return

  def close(self):
    self._stop.set()

  def suspects(self, timeout_s: float = 5.0) -> str:
    """The peers most likely to hold the others up, in words ("process 2", "processes 1, 3"), read from
    their beacons within `timeout_s` (the coordinator, which holds them, may itself be the one stopped)."""
    import threading
    import time

    others = [p for p in range(self.count) if p != self.process]
    seen = {}

    def read():
      for p in others:
        try:
          step, stamp = self._client.key_value_try_get(f"{_BEACON_KEY}{p}").split()
          seen[p] = (int(step), float(stamp))
        except Exception:
          seen[p] = None
    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
      return "process 0 (the coordinator, which does not answer)" if self.process != 0 else _names(others)
    now = time.time()
    stale = [p for p in others if seen.get(p) is None or now - seen[p][1] > 3 * self.every + 2]
    if stale:
      return _names(stale)
    lowest = min(seen[p][0] for p in others)
    behind = [p for p in others if seen[p][0] == lowest and lowest < self.step]
    return _names(behind or others)


def _names(processes: list) -> str:
  return ("process " if len(processes) == 1 else "processes ") + ", ".join(map(str, processes))
