"""The multiple-choice task family (SWAG, RACE-style) as a task module of the fine-tuning trainer: readers
for SWAG's CSV layout (`swag:DIR`) and a JSONL layout (`jsonl:DIR`), features with one (context, choice)
pair per row, and BertForMultipleChoice's head, loss and accuracy.

The head is the sentence classifier with one output (`model.Classifier(num_outputs=1)`: tanh pooler on
[CLS], dropout, linear) applied to every (context, choice) pair; the scores of one example's choices go
through a softmax, as BertForMultipleChoice does. Examples with fewer choices than the widest one get
masked padding choices that never win and carry no probability.
"""

import csv
import dataclasses
import json
import os

import jax.numpy as jnp
import numpy as np
import optax

from bertjax.core.errors import UserError
from bertjax.finetune import model as task_model, task_models
from bertjax.finetune.model import MultipleChoice
from bertjax.finetune.tasks import TaskData
from bertjax.hf.tokenizers import encode_example

SWAG_ENDINGS = ("ending0", "ending1", "ending2", "ending3")
OUTPUT_POSITION_AXIS = None  # outputs are per example: [B, choices]
MASKED = -1e9  # the score of a padding choice


@dataclasses.dataclass
class Examples:
  """One split: the context and, per choice, the text paired with it (question + choice), and labels."""

  contexts: list
  choices: list  # list of lists of str (question and choice joined)
  labels: np.ndarray  # int32 index of the right choice
  path: str


def _join(question: str, choice: str) -> str:
  """The second segment of a pair: RACE-style cloze questions with "_" get the choice in the blank
  (ALBERT's run_race), others are followed by it (SWAG's sent2 + ending, as run_swag)."""
  if "_" in question:
    return question.replace("_", choice)
  return f"{question} {choice}".strip()


def _label(value, n_choices: int, where: str) -> int:
  try:
    label = int(value)
  except (TypeError, ValueError):
    raise UserError(f"{where}: label {value!r} is not a choice index") from None
  if not 0 <= label < n_choices:
    raise UserError(f"{where}: label {label} is not one of the {n_choices} choices (0-based)")
  return label


def read_swag(path: str) -> Examples:
  """SWAG's CSV (swagaf data/{train,val}.csv): sent1 is the context, sent2 + each of ending0..3 the
  continuations, label the right ending."""
  if not os.path.isfile(path):
    raise UserError(f"{path}:0: no such file; point --config.task.source=swag:DIR at SWAG's data directory")
  contexts, choices, labels = [], [], []
  with open(path, encoding="utf-8", newline="") as f:
    rows = csv.DictReader(f)
    need = ("sent1", "sent2", "label") + SWAG_ENDINGS
    missing = [c for c in need if c not in (rows.fieldnames or ())]
    if missing:
      raise UserError(f"{path}:1: no column(s) {', '.join(missing)}; SWAG's CSV has sent1, sent2, ending0-3, "
                      "label (the test split has no labels)")
    for row in rows:
      where = f"{path}:{rows.line_num}"
      contexts.append(row["sent1"])
      choices.append([_join(row["sent2"], row[e]) for e in SWAG_ENDINGS])
      labels.append(_label(row["label"], len(SWAG_ENDINGS), where))
  if not contexts:
    raise UserError(f"{path}:2: no examples in the file")
  return Examples(contexts, choices, np.asarray(labels, np.int32), path)


def read_jsonl(path: str) -> Examples:
  """One JSON object a line: {"context", "question", "choices": [...], "label"} (question may be empty)."""
  if not os.path.isfile(path):
    raise UserError(f"{path}:0: no such file; point --config.task.source=jsonl:DIR at the directory")
  contexts, choices, labels = [], [], []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      where = f"{path}:{number}"
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise UserError(f"{where}: not a JSON object ({e.msg})") from None
      if not isinstance(row, dict) or not isinstance(row.get("choices"), list) or "context" not in row \
          or len(row["choices"]) < 2:
        raise UserError(f'{where}: expected {{"context", "question", "choices": [at least 2], "label"}}')
      contexts.append(str(row["context"]))
      choices.append([_join(str(row.get("question", "")), str(c)) for c in row["choices"]])
      labels.append(_label(row.get("label"), len(row["choices"]), where))
  if not contexts:
    raise UserError(f"{path}:1: no examples in the file")
  return Examples(contexts, choices, np.asarray(labels, np.int32), path)


def read_split(task, train: bool) -> Examples:
  """The training or evaluation examples of task.source (swag:DIR or jsonl:DIR)."""
  kind, _, arg = task.source.partition(":")
  name = task.train_file if train else task.eval_file
  if kind == "swag" and arg:
    return read_swag(os.path.join(arg, name))
  if kind == "jsonl" and arg:
    return read_jsonl(os.path.join(arg, name))
  raise UserError(f"unknown multiple-choice source {task.source!r}; use --config.task.source=swag:DIR or jsonl:DIR")


def subsample(ex: Examples, n: int, seed: int) -> Examples:
  """A fixed random subset of n examples in file order (all when n is 0 or at least the split)."""
  if not n or n >= len(ex.contexts):
    return ex
  idx = np.sort(np.random.default_rng(seed).choice(len(ex.contexts), n, replace=False))
  return Examples([ex.contexts[i] for i in idx], [ex.choices[i] for i in idx], ex.labels[idx], ex.path)


def encode(ex: Examples, tokenizer, seq_len: int, num_choices: int = 0) -> dict:
  """Arrays [N, C, seq_len] (input_ids, type_ids, groups) of every (context, choice) pair with the
  checkpoint's template, label [N] and choice_mask [N, C] (0 for padding choices); C is the widest
  example's choice count, or num_choices when larger."""
  n = len(ex.contexts)
  c = max(num_choices, max(len(x) for x in ex.choices))
  ids = np.full((n, c, seq_len), tokenizer.special.pad, np.int32)
  types, groups = np.zeros((n, c, seq_len), np.int32), np.zeros((n, c, seq_len), np.int32)
  mask = np.zeros((n, c), np.float32)
  for i, (context, options) in enumerate(zip(ex.contexts, ex.choices)):
    for j, option in enumerate(options):
      row, row_types = encode_example(tokenizer, context, option, seq_len)
      ids[i, j, :len(row)], types[i, j, :len(row)], groups[i, j, :len(row)] = row, row_types, 1
      mask[i, j] = 1.0
  ids[mask == 0, 0] = tokenizer.special.cls  # padding choices: a lone [CLS], masked out of the softmax
  groups[mask == 0, 0] = 1
  return dict(input_ids=ids, type_ids=types, groups=groups, label=ex.labels, choice_mask=mask)


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


def prepare(config, loaded) -> TaskData:
  """Both splits read and encoded to [N, choices, seq_len] pairs with the checkpoint's template."""
  task = config.task
  train_ex = subsample(read_split(task, True), task.max_train_examples, config.seed)
  eval_ex = subsample(read_split(task, False), task.max_eval_examples, config.seed)
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
