"""`python -m bertjax.finetune --config=configs/finetune.py:TASK --config.init.checkpoint=CKPT
--config.task.source=tsv:DIR --workdir=DIR`: fine-tune on a sentence(-pair) task over several seeds."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from absl import flags
from ml_collections import config_flags

from bertjax.errors import cli, run

_CONFIG = config_flags.DEFINE_config_file("config", None, "config file, e.g. configs/finetune.py:rte", lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "where per-seed metrics and results.json go")
flags.mark_flags_as_required(["config", "workdir"])


@cli
def main(argv):
  del argv
  from bertjax.downstream import train

  train.finetune(_CONFIG.value, _WORKDIR.value)


if __name__ == "__main__":
  run(main)
