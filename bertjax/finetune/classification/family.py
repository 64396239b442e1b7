"""The classification family as it registers itself with the trainer and `python -m bertjax.finetune.predict` (imported by
bertjax.finetune.tasks when config.task.kind=classification or a classification model is read; the package's __init__ imports nothing,
so that its command-line modules run with `python -m`)."""

from bertjax.finetune import tasks
from bertjax.finetune.classification import early_exit_task, hf, predict, task


def variant(config):
  """The task module `config` runs: the early-exit classifier (early_exit_task) when --config.early_exit names a
  method, else the classification task."""
  return early_exit_task if config.get("early_exit", "") else task


FAMILY = tasks.Family("classification", task, hf, predict, variant)
tasks.register(FAMILY)
