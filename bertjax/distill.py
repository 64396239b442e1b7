"""`python -m bertjax.distill --config=configs/distill.py:tiny --config.teacher=DIR --workdir=W`: distil a
pretrained teacher into a smaller student (the run itself: bertjax.compress.distill.run; a config with a `transfer`
section, configs/mobilebert.py:tiny_transfer, runs MobileBERT's progressive transfer first: bertjax.compress.transfer.run)."""

from bertjax.core.cli import run_config_workdir

if __name__ == "__main__":
  run_config_workdir("configs/distill.py:tiny", "where the distilled student's run goes", "bertjax.compress.transfer:run")
