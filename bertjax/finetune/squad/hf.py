"""The squad family's models on disk: a fine-tuned SpanQA saved as a bertjax model directory (qa.json with the
head and the SQuAD settings it was trained with) and transformers' *ForQuestionAnswering checkpoints (BERT,
RoBERTa, ALBERT, ELECTRA: `qa_outputs`), in and out. `python -m bertjax.finetune.predict` answers with them and
exports them."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.core.errors import UserError
from bertjax.finetune.model import restore_params
from bertjax.finetune.squad.model import SpanQA
from bertjax.finetune.task_models import TaskModel
from bertjax.hf import configs as hf_configs, convert, safetensors_io, tokenizers as hf_tokenizers, weights as W

MODEL_FILE = "qa.json"
HF_SUFFIXES = ("ForQuestionAnswering",)


QA_FILE = MODEL_FILE  # beside a saved model's config.json: the head and the task settings it was trained with
ARCH = {"bert": "BertForQuestionAnswering", "roberta": "RobertaForQuestionAnswering",
        "albert": "AlbertForQuestionAnswering", "electra": "ElectraForQuestionAnswering"}


def read_head(hf_dir: str) -> dict | None:
  """{"qa_outputs": {"kernel" [H, 2], "bias" [2]}} of an HF *ForQuestionAnswering directory, else None."""
  is_hf = os.path.isfile(os.path.join(hf_dir, "config.json")) and not os.path.isdir(os.path.join(hf_dir, "checkpoints"))
  if not is_hf:  # a bertjax workdir (pretraining run or import) has no span head
    return None
  tensors = safetensors_io.read_dir(hf_dir)
  if "qa_outputs.weight" not in tensors:
    return None
  return {"qa_outputs": {"kernel": np.asarray(tensors["qa_outputs.weight"], np.float32).T.copy(),
                         "bias": np.asarray(tensors["qa_outputs.bias"], np.float32)}}


def read_hf(hf_dir: str) -> TaskModel:
  """An HF *ForQuestionAnswering checkpoint as a squad task model (no settings: predict uses run_squad.py's)."""
  from bertjax.model import config as model_config

  head = read_head(hf_dir)
  if head is None:
    raise UserError(f"{hf_dir} has no qa_outputs; give a *ForQuestionAnswering checkpoint")
  imp = convert.read_hf(hf_dir)
  model = SpanQA(model_config.encoder_config(imp.config.model), deterministic=True)
  params = {"embeddings": imp.params["embeddings"], "encoder": imp.params["encoder"], **head}
  return TaskModel("squad", imp.config, model, jax.tree.map(jnp.asarray, params), imp.tokenizer, {})


def write_hf(task_model: TaskModel, out_dir: str) -> str:
  """Exports a SpanQA task model (span head only) as transformers' *ForQuestionAnswering of its family."""
  run_config, params, tokenizer = task_model.config, task_model.params, task_model.tokenizer
  family = hf_configs.family_for(run_config)
  if family not in ARCH:
    raise UserError(f"transformers has no {family} question-answering class bertjax exports to")
  if "answerable" in params:
    raise UserError("the answerable head has no transformers class; export a model trained without it")
  special = tokenizer.special if tokenizer else convert.SpecialIds(0, 1, 2, 3, 4)
  params = jax.tree.map(np.asarray, params)
  hf = hf_configs.to_hf(run_config, family, ARCH[family], special)
  tensors = convert.encoder_tensors(run_config, params, family, special)
  tensors.update(W.export_tensors(W.entries_of("qa_outputs", "qa_outputs"), params))
  return convert.write_dir(out_dir, hf, tensors, tokenizer)


def save_model(directory: str, run_config, model: SpanQA, params) -> None:
  """Writes a fine-tuned SpanQA: config.json (its encoder's run config, whose data.tokenizer names the
  tokenizer), the params checkpoint, and qa.json (answerable head; the window and post-processing
  settings it was trained with)."""
  from bertjax.hf import workdir as wd

  head = dict(answerable_head=model.answerable_head, **dict(model.settings))
  wd.write(directory, run_config, params, dict(head=head))
  with open(os.path.join(directory, QA_FILE), "w") as f:
    json.dump(head, f, indent=2)


def load_model(directory: str) -> tuple:
  """(run config, SpanQA, params, tokenizer, qa.json settings) of a model written by `save_model`."""
  from bertjax.hf import workdir as wd
  from bertjax.model import config as model_config

  path = os.path.join(directory, QA_FILE)
  if not os.path.isfile(path):
    raise UserError(f"no fine-tuned QA model at {directory!r} (no {QA_FILE}); fine-tune SQuAD with "
                    "--config.save_model=True, which writes WORKDIR/seed_S/model")
  with open(path) as f:
    head = json.load(f)
  run_config = wd.load_config(directory)
  model = SpanQA(model_config.encoder_config(run_config.model), deterministic=True,
                 answerable_head=head["answerable_head"])
  params = restore_params(directory, model)
  spec = run_config.data.get("tokenizer", "")
  tok = hf_tokenizers.load_any(spec) if spec else None
  head.pop("answerable_head")
  return run_config, model, params, tok, head


def load(directory: str) -> TaskModel:
  """A SpanQA written by `save_model` as a task model (info: the qa.json settings it answers with)."""
  run_config, model, params, tok, settings = load_model(directory)
  return TaskModel("squad", run_config, model, params, tok, settings)


def save(directory: str, run_config, params, info: dict) -> None:
  """A squad task model in the qa.json layout (`info`: answerable_head and the SQuAD settings)."""
  from bertjax.model import config as model_config

  info = dict(info)
  answerable = bool(info.pop("answerable_head", "answerable" in params))
  model = SpanQA(model_config.encoder_config(run_config.model), deterministic=True, answerable_head=answerable,
                 settings=tuple(info.items()))
  save_model(directory, run_config, model, params)
