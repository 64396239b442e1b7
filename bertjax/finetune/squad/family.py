"""The squad family as it registers itself with the trainer and `python -m bertjax.finetune.predict` (imported by
bertjax.finetune.tasks when config.task.kind=squad or a squad model is read; the package's __init__ imports nothing,
so that its command-line modules run with `python -m`)."""

from bertjax.finetune import tasks
from bertjax.finetune.squad import hf, predict, task

FAMILY = tasks.Family("squad", task, hf, predict)
tasks.register(FAMILY)
