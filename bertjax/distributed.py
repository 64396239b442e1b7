"""Process-level setup before JAX runs anything: platform flags and multi-host initialization."""

import os

import jax


def hide_accelerators_from_tensorflow():
  """TensorFlow (for tfds) must not grab the TPU/GPU memory that JAX needs."""
  try:
    import tensorflow as tf  # optional

    tf.config.set_visible_devices([], "GPU")
    tf.config.set_visible_devices([], "TPU")
  except Exception:
    pass


def setup():
  """Sets JAX's flags once and joins a multi-process job when the environment describes one.

  On TPU pod slices `jax.distributed.initialize()` finds everything itself; elsewhere (multi-GPU,
  SLURM) JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES and JAX_PROCESS_ID name the job (launch/).
  """
  jax.config.update("jax_threefry_partitionable", True)  # random bits need no cross-device traffic
  n = int(os.environ.get("JAX_NUM_PROCESSES", "1"))
  tpu_hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
  if n > 1:
    jax.distributed.initialize(
        coordinator_address=os.environ["JAX_COORDINATOR_ADDRESS"], num_processes=n,
        process_id=int(os.environ["JAX_PROCESS_ID"]))
  elif "," in tpu_hosts:
    jax.distributed.initialize()
