"""`python -m bertjax.train --config=configs/bert.py:tiny --workdir=DIR [--config.KEY=VALUE ...]`."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags
from ml_collections import config_flags

from bertjax import distributed
from bertjax.errors import cli, run

_CONFIG = config_flags.DEFINE_config_file("config", None, "config file, e.g. configs/bert.py:base", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "where metrics, TensorBoard events and checkpoints go")
flags.mark_flags_as_required(["config", "workdir"])


@cli
def main(argv):
  del argv
  distributed.setup()  # platform flags, jax.distributed.initialize() on multi-host jobs
  from bertjax import loop

  loop.train_and_evaluate(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  run(main)
