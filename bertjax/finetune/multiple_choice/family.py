"""The multiple_choice family as it registers itself with the trainer and `python -m bertjax.finetune.predict` (imported by
bertjax.finetune.tasks when config.task.kind=multiple_choice or a multiple_choice model is read; the package's __init__ imports nothing,
so that its command-line modules run with `python -m`)."""

from bertjax.finetune import tasks
from bertjax.finetune.multiple_choice import hf, predict, task

FAMILY = tasks.Family("multiple_choice", task, hf, predict)
tasks.register(FAMILY)
