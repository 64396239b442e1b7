"""Process setup, called explicitly by every entry point before JAX runs anything: `setup()`.

Importing bertjax (or any of its modules) has no side effects; an entry point (`python -m bertjax.train`,
the other CLIs, the notebook, the tests' conftest) calls `setup()` once, first. It
- joins a multi-process job when the environment describes one (`jax.distributed.initialize()`),
- makes random bits partitionable (no cross-device traffic to generate them),
and, only where JAX will run on this host's CPU:
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


def setup(join_timeout_s: float = 300.0, heartbeat_timeout_s: float = 100.0):
  """Platform choice, allocator policy, JAX flags and multi-host initialization (see join_job for the
  timeouts, which the training CLIs take from config.startup_timeout and config.heartbeat_timeout); once
  per process (a second call does nothing)."""
  if _DONE:
    return
  _DONE.append(True)
  _cpu_when_libtpu_has_no_tpu()
  if os.environ.get("BERTJAX_HOST_MALLOC", "default") == "retain" and runs_on_cpu():
    retain_host_memory()
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
