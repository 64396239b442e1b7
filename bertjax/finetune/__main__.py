"""`python -m bertjax.finetune --config=configs/finetune.py:TASK --config.init.checkpoint=CKPT
--config.task.source=tsv:DIR --workdir=DIR`: fine-tune on a sentence(-pair) task over several seeds."""

from bertjax.core.cli import run_config_workdir

if __name__ == "__main__":
  run_config_workdir("configs/finetune.py:rte", "where per-seed metrics and results.json go",
                     "bertjax.finetune.train:finetune")
