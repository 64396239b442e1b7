"""The graph family's models on disk: a fine-tuned GraphModel directory (task.json with the hop's settings).
transformers has no Transformer-XH class, so there is nothing to import or export."""

from bertjax.core.errors import UserError
from bertjax.finetune import task_models
from bertjax.finetune.graph.model import GraphModel
from bertjax.model import config as model_config, xh

MODEL_FILE = task_models.TASK_FILE
HF_SUFFIXES = ()  # no transformers class holds the extra hop


def build(run_config, info: dict, cfg=None) -> GraphModel:
  """The deterministic GraphModel from its run config and task.json info."""
  cfg = cfg or model_config.encoder_config(run_config.model)
  return GraphModel(cfg, xh.HopConfig(**info["hop"]), info["num_outputs"], info.get("classifier_dropout", 0.1),
                    deterministic=True, tokenizer=info.get("tokenizer", ""))


def save(directory: str, run_config, params, info: dict) -> None:
  """The task.json layout (the hop's settings, outputs, classifier_dropout)."""
  task_models.write_task_dir(directory, "graph", run_config, params, info)


def load(directory: str):
  """A graph model written by `save`."""
  return task_models.load_task_dir(directory, "graph", build)


def _none(*args):
  raise UserError("transformers has no Transformer-XH class: a graph model stays a bertjax task model (task.json)")


read_hf = write_hf = _none
