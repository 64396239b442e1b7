"""bertjax: pretraining BERT-family encoders (BERT, RoBERTa, ALBERT, ELECTRA) in JAX/Flax."""

import importlib.util
import os

__version__ = "0.1.0"


def _cpu_when_libtpu_has_no_tpu():
  """With libtpu installed (it compiles for TPU topologies in `bertjax.aot`) but no TPU chip on this host,
  JAX would still try the TPU backend first and libtpu would print its warnings in every process. When
  nothing else chooses the platform (JAX_PLATFORMS unset, no GPU plugin), JAX falls back to the CPU
  anyway: say so up front, before any backend starts."""
  if os.environ.get("JAX_PLATFORMS") or importlib.util.find_spec("libtpu") is None:
    return
  if importlib.util.find_spec("jax_plugins") is not None:  # a GPU (or other) PJRT plugin: leave JAX to choose
    return
  import jax
  from jax._src import hardware_utils

  if hardware_utils.num_available_tpu_chips_and_device_id()[0] == 0 and jax.config.jax_platforms is None:
    jax.config.update("jax_platforms", "cpu")


_cpu_when_libtpu_has_no_tpu()
