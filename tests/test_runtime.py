"""bertjax.core.runtime: process set-up before JAX starts (CPU pinning, host memory reuse), and imports without it."""

import json
import os
import subprocess
import sys

import pytest

from bertjax.core import runtime

# A jitted function whose temporaries (64 MiB each) exceed glibc's largest heap-served block, called three
# times; prints the minor page faults of the last two calls, in MiB per call.
_FAULTS = """
import resource, json
from bertjax.core import runtime
runtime.setup()
import jax, jax.numpy as jnp
f = jax.jit(lambda x: (jnp.sin(x) @ jnp.cos(x)).sum())
x = jnp.ones((4096, 4096), jnp.float32)
f(x).block_until_ready()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(2):
  f(x).block_until_ready()
print(json.dumps((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) * 4096 / 2 / 2**20))
"""


def _faulted_mib_per_call(policy: str) -> float:
  env = dict(os.environ, BERTJAX_HOST_MALLOC=policy, JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-c", _FAULTS], capture_output=True, text=True, env=env, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # > 15 s cold: the normal tier stays under 8 minutes (README)
@pytest.mark.skipif(sys.platform != "linux", reason="the policy is glibc's mallopt; elsewhere it is a no-op")
def test_cpu_steps_reuse_freed_host_memory():
  """With glibc's default policy every call maps its temporaries afresh and faults them in (4 GiB a call
  here, measured); with bertjax's the pages of the call before are reused (64 MiB)."""
  default, retained = _faulted_mib_per_call("default"), _faulted_mib_per_call("retain")
  assert default > 64, default  # the premise: the default policy re-faults the temporaries every call
  assert retained < default / 10, (retained, default)


def test_runs_on_cpu_follows_the_chosen_platform(monkeypatch):
  monkeypatch.setenv("JAX_PLATFORMS", "cpu")
  assert runtime.runs_on_cpu()
  monkeypatch.setenv("JAX_PLATFORMS", "cuda,cpu")
  assert not runtime.runs_on_cpu()
  monkeypatch.setenv("JAX_PLATFORMS", "tpu")
  assert not runtime.runs_on_cpu()


def test_importing_bertjax_has_no_side_effects():
  """Importing the package or its data layer neither imports JAX nor sets anything up: entry points call
  `runtime.setup()` themselves."""
  code = ("import sys, bertjax, bertjax.core.runtime, bertjax.data.shards, bertjax.data.instances;"
          "assert 'jax' not in sys.modules, 'jax was imported';"
          "assert not bertjax.core.runtime._DONE, 'setup ran at import'")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert proc.returncode == 0, proc.stderr[-2000:]
