"""The tagging family as it registers itself with the trainer and `python -m bertjax.finetune.predict` (imported by
bertjax.finetune.tasks when config.task.kind=tagging or a tagging model is read; the package's __init__ imports nothing,
so that its command-line modules run with `python -m`)."""

from bertjax.finetune import tasks
from bertjax.finetune.tagging import hf, predict, task

FAMILY = tasks.Family("tagging", task, hf, predict)
tasks.register(FAMILY)
