"""The classification family as it registers itself with the trainer and `python -m bertjax.finetune.predict` (imported by
bertjax.finetune.tasks when config.task.kind=classification or a classification model is read; the package's __init__ imports nothing,
so that its command-line modules run with `python -m`)."""

from bertjax.finetune import tasks
from bertjax.finetune.classification import hf, predict, task

FAMILY = tasks.Family("classification", task, hf, predict)
tasks.register(FAMILY)
