"""The multiple-choice task family (SWAG, RACE-style) as a task module of the fine-tuning trainer: its data
(this package's `data`: SWAG's CSV layout, `swag:DIR`, and a JSONL layout, `jsonl:DIR`, one (context, choice)
pair per row), BertForMultipleChoice's head (`model`), loss and accuracy, and its saved models (`hf`).

The head is the sentence classifier with one output (`classification.model.Classifier(num_outputs=1)`: tanh pooler on
[CLS], dropout, linear) applied to every (context, choice) pair; the scores of one example's choices go
through a softmax, as BertForMultipleChoice does. Examples with fewer choices than the widest one get
masked padding choices that never win and carry no probability.
"""

import jax.numpy as jnp
import numpy as np
import optax

from bertjax.core.errors import UserError
from bertjax.finetune import model as task_model, task_models
from bertjax.finetune.multiple_choice.data import encode, read_split, subsample
from bertjax.finetune.multiple_choice.model import MultipleChoice
from bertjax.finetune.tasks import TaskData

OUTPUT_POSITION_AXIS = None  # outputs are per example: [B, choices]
MASKED = -1e9  # the score of a padding choice


def choice_logits(params, batch, model, rng=None, head_gates=None):
  """Scores [B, C] of every choice with padding choices at MASKED (no probability, never predicted)."""
  out = model.apply({"params": params}, batch["input_ids"], batch["type_ids"], batch["groups"],
                    *(() if head_gates is None else (head_gates,)), rngs={"dropout": rng} if rng is not None else {})
  return jnp.where(batch["choice_mask"] > 0, out, MASKED)


def accuracy(scores: np.ndarray, labels: np.ndarray) -> dict:
  """{"accuracy": share of examples whose highest-scoring choice is the labeled one}."""
  return {"accuracy": float(np.mean(scores.argmax(-1) == labels))}


# ---------------------------------------------------------------- the task module's functions


def validate(config):
  """One-line errors for a multiple-choice config that cannot run."""
  if not config.task.source:
    raise UserError("set --config.task.source to swag:DIR (SWAG's CSVs) or jsonl:DIR")
  if config.seq_len < 8:
    raise UserError(f"seq_len={config.seq_len} is too short for [CLS] context [SEP] choice [SEP]; use >= 8")


def read(config) -> tuple:
  """(training examples, evaluation examples): both splits read and checked, before the trainer loads the
  checkpoint."""
  task = config.task
  return (subsample(read_split(task, True), task.max_train_examples, config.seed),
          subsample(read_split(task, False), task.max_eval_examples, config.seed))


def prepare(config, loaded, raw: tuple | None = None) -> TaskData:
  """Both splits (`raw`, what `read` returned; read now when None) encoded to [N, choices, seq_len] pairs with
  the checkpoint's template."""
  train_ex, eval_ex = raw if raw is not None else read(config)
  width = max(max(len(c) for c in ex.choices) for ex in (train_ex, eval_ex))
  return TaskData(
      train=encode(train_ex, loaded.tokenizer, config.seq_len, width),
      eval=encode(eval_ex, loaded.tokenizer, config.seq_len, width),
      info=dict(train_examples=len(train_ex.contexts), eval_examples=len(eval_ex.contexts), skipped_rows=0,
                choices=width),
      model=dict(tokenizer=loaded.tokenizer.spec()))


def model(config, cfg, data: TaskData, deterministic: bool) -> MultipleChoice:
  """BertForMultipleChoice's head (pooler, dropout, one output) over the encoder `cfg`."""
  return MultipleChoice(cfg, 1, config.model.classifier_dropout, deterministic=deterministic, head="pooler",
                        tokenizer=data.model.get("tokenizer", ""))


def init_params(model, rng, loaded) -> tuple[dict, list]:
  """(params, fresh names): embeddings, encoder and the pretrained pooler (where the checkpoint has one),
  the one-output classifier from `rng`."""
  pooler = loaded.params.get("sentence", {}).get("pooler", loaded.pooler)
  return task_model.init_params(model, rng, loaded.params, pooler)


def loss(outputs, batch):
  """Per-example softmax cross-entropy over the choices, padding choices masked."""
  logits = jnp.where(batch["choice_mask"] > 0, outputs, MASKED)
  return optax.softmax_cross_entropy_with_integer_labels(logits, batch["label"])


def evaluate(outputs, data: TaskData, config, seed_dir) -> dict:
  """{"accuracy"} over the eval split (padding choices never predicted)."""
  del config, seed_dir
  scores = np.where(data.eval["choice_mask"] > 0, np.asarray(outputs), MASKED)
  return accuracy(scores, data.eval["label"])


def save_model(directory: str, run_config, model, params) -> None:
  """A seed's fine-tuned multiple-choice model as a bertjax task model (task_models.load reads it)."""
  info = dict(classifier_dropout=model.classifier_dropout, tokenizer=model.tokenizer)
  task_models.save(directory, "multiple_choice", run_config, params, info)
