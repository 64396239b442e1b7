"""`python -m bertjax.train --config=configs/bert.py:tiny --workdir=DIR [--config.KEY=VALUE ...]`."""

from bertjax.core.cli import run_config_workdir


def train(config, workdir: str):
  """The loop, told which config keys the command line set: with --config.init_from=hf:DIR the checkpoint
  decides the architecture, and such a key that disagrees with it is an error (bertjax.hf.init_from)."""
  from absl import flags
  from ml_collections import config_flags

  from bertjax.hf import init_from  # noqa: F401 (registers --config.init_from=hf:DIR with the loop)
  from bertjax.train import loop

  return loop.train_and_evaluate(config, workdir, frozenset(config_flags.get_override_values(flags.FLAGS["config"])))


if __name__ == "__main__":
  run_config_workdir("configs/bert.py:base", "where metrics, TensorBoard events and checkpoints go", "bertjax.train.__main__:train")
