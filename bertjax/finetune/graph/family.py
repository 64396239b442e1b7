"""The graph family as it registers itself with the trainer (imported by bertjax.finetune.tasks when
config.task.kind=graph or a graph model is read; the package's __init__ imports nothing)."""

from bertjax.finetune import tasks
from bertjax.finetune.graph import hf, span, task


def variant(config):
  """The task module a config runs: span extraction (task.target=span) or graph classification."""
  return span if config.task.get("target", "classification") == "span" else task


FAMILY = tasks.Family("graph", task, hf, None, variant)
tasks.register(FAMILY)
