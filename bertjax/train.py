"""`python -m bertjax.train --config=configs/bert.py:tiny --workdir=DIR [--config.KEY=VALUE ...]`."""

from bertjax.errors import run_config_workdir

if __name__ == "__main__":
  run_config_workdir("configs/bert.py:base", "where metrics, TensorBoard events and checkpoints go",
                     "bertjax.loop:train_and_evaluate", pass_overridden=True)
