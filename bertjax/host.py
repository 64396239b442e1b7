"""Process-wide setup that must happen before JAX starts a backend; `import bertjax` runs `setup()`.

Two things, both only where JAX will run on this host's CPU:
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


def setup():
  _cpu_when_libtpu_has_no_tpu()
  if os.environ.get("BERTJAX_HOST_MALLOC", "default") == "retain" and runs_on_cpu():
    retain_host_memory()
