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


def startup_check(mesh, timeout_s: float = 300.0) -> float:
  """One all-reduce over every device of every process, with a clear message if it hangs.

  A multi-host job whose hosts cannot reach each other (wrong coordinator, a host that never started,
  a firewall) otherwise hangs silently in its first collective. Returns the seconds it took.
  """
  import threading
  import time

  import numpy as np
  from jax.sharding import NamedSharding, PartitionSpec as P

  from bertjax.errors import UserError

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
