"""The token-classification task family (NER, chunking, POS) as a task module of the fine-tuning trainer
(interface: docs/finetune_tasks.md): the per-token head, its token-averaged loss, and the evaluation that
reads window predictions back to words, writes conlleval's input and scores entities.

The head (tagging.model.TokenClassifier) is BertForTokenClassification's (and RoBERTa's, ALBERT's, ELECTRA's):
dropout on every final hidden state, then one linear layer to the tag logits. Data and features are in this
package's `data`, metrics in `metrics`, saved models and transformers' directories in `hf`.
"""

import json
import os

import numpy as np
import optax

from bertjax.core.errors import UserError
from bertjax.finetune import model as task_model, task_models
from bertjax.finetune.tagging import data as tag_data, metrics as tag_metrics
from bertjax.finetune.tagging.model import TokenClassifier
from bertjax.finetune.tasks import TOKEN_FIELDS, TaskData

PREDICTIONS_FILE = "predictions.conll"  # under workdir/seed_S/: token, gold, predicted per line
ENTITY_FILE = "entity_metrics.json"  # under workdir/seed_S/: precision, recall, f1, support per entity type
OUTPUT_POSITION_AXIS = 1  # outputs are [windows, seq, labels]


def _check(ok: bool, message: str):
  if not ok:
    raise UserError(message)


def stride_of(config) -> int:
  """task.window_stride, or half the window (seq_len - 2 subwords) when it is 0."""
  return config.task.window_stride or max(1, (config.seq_len - 2) // 2)


def validate(config):
  """One-line errors for a tagging config that cannot run."""
  task = config.task
  _check(bool(task.source), "set --config.task.source to conll:DIR (DIR/task.train_file, DIR/task.eval_file) "
         "or tfds:conll2003")
  _check(task.tag_scheme in tag_metrics.SCHEMES, f"task.tag_scheme={task.tag_scheme!r}; use one of "
         f"{', '.join(tag_metrics.SCHEMES)}")
  _check(config.seq_len >= 4, f"seq_len={config.seq_len} is too short for [CLS] word [SEP]; use >= 4")
  _check(0 < stride_of(config) <= config.seq_len - 2, f"task.window_stride={task.window_stride} must be in "
         f"[1, seq_len - 2 = {config.seq_len - 2}] (0: half the window)")


def read(config) -> tuple:
  """(training sentences, evaluation sentences, labels, scheme): both splits read and checked (every evaluation
  tag seen in training), before the trainer loads the checkpoint. The label set and the scheme come from the
  whole training file, before task.max_train_examples subsamples it."""
  task = config.task
  train_all, eval_all = tag_data.read_split(task, True), tag_data.read_split(task, False)
  labels = tag_data.label_set(train_all)
  tag_data.check_tags(eval_all, labels, train_all.path)
  scheme = tag_data.scheme_of(task, train_all)
  return (tag_data.subsample(train_all, task.max_train_examples, config.seed),
          tag_data.subsample(eval_all, task.max_eval_examples, config.seed), labels, scheme)


def prepare(config, loaded, raw: tuple | None = None) -> TaskData:
  """Both splits (`raw`, what `read` returned; read now when None) windowed to seq_len with the checkpoint's
  tokenizer."""
  task = config.task
  train_s, eval_s, labels, scheme = raw if raw is not None else read(config)
  labels = list(labels)  # encode may add continuation tags (label_all_subwords)
  stride, tok = stride_of(config), loaded.tokenizer
  train = tag_data.encode(train_s, tok, labels, config.seq_len, stride, scheme, task.label_all_subwords)
  evals = tag_data.encode(eval_s, tok, labels, config.seq_len, stride, scheme, task.label_all_subwords)
  keep = TOKEN_FIELDS + ("tag", "tag_weight")
  words = lambda s: sum(len(w) for w in s.words)
  return TaskData(
      train={k: train[k] for k in keep}, eval={k: evals[k] for k in keep},
      info=dict(train_examples=len(train_s.words), eval_examples=len(eval_s.words), skipped_rows=0,
                train_windows=len(train["input_ids"]), eval_windows=len(evals["input_ids"]),
                eval_words=words(eval_s), labels=list(labels), scheme=scheme, window_stride=stride),
      model=dict(labels=tuple(labels), scheme=scheme, tokenizer=tok.spec()),
      extra=dict(sentences=eval_s, scored=evals["scored"], word=evals["word"], sentence=evals["sentence"]),
      token_fields=TOKEN_FIELDS + ("tag", "tag_weight"))


def model(config, cfg, data: TaskData, deterministic: bool) -> TokenClassifier:
  """The TokenClassifier over the encoder `cfg`, with the training file's labels."""
  labels = data.model["labels"]
  return TokenClassifier(cfg, len(labels), config.model.classifier_dropout, deterministic, labels,
                         data.model["scheme"], data.model["tokenizer"])


def init_params(model, rng, loaded) -> tuple[dict, list]:
  """(params, fresh names): embeddings and encoder pretrained, the classifier from `rng` (no pooler)."""
  return task_model.init_params(model, rng, loaded.params, None)


def loss(outputs, batch):
  """(numerator, denominator) per row: the token cross-entropy summed over the row's weighted positions
  and their count, so the trainer averages over every labeled token of the batch (BertForTokenClassification's
  mean over labels != -100)."""
  per = optax.softmax_cross_entropy_with_integer_labels(outputs, batch["tag"])
  w = batch["tag_weight"]
  return (per * w).sum(-1), w.sum(-1)


def evaluate(outputs, data: TaskData, config, seed_dir: str | None) -> dict:
  """f1, precision, recall (entities, conlleval) and accuracy (words) over the eval split, each word read
  from its scored subword; writes seed_dir/predictions.conll (token, gold, predicted) and the per-type
  scores to seed_dir/entity_metrics.json."""
  del config
  x = data.extra
  arrays = dict(scored=x["scored"], word=x["word"], sentence=x["sentence"])
  ids = tag_data.word_predictions(arrays, np.asarray(outputs).argmax(-1), x["sentences"])
  labels = data.model["labels"]
  pred = [[labels[i] for i in s] for s in ids]
  s = x["sentences"]
  scores = tag_metrics.score(s.tags, pred, data.model["scheme"])
  if seed_dir is not None:
    tag_metrics.write_conll(os.path.join(seed_dir, PREDICTIONS_FILE), s.words, s.tags, pred)
    with open(os.path.join(seed_dir, ENTITY_FILE), "w") as f:
      json.dump(scores["per_type"], f, indent=2)
  return {k: scores[k] for k in ("f1", "precision", "recall", "accuracy")}


def save_model(directory: str, run_config, model, params) -> None:
  """A seed's fine-tuned tagger as a bertjax task model (task_models.load and the tag command read it)."""
  info = dict(labels=list(model.labels), scheme=model.scheme, classifier_dropout=model.classifier_dropout,
              tokenizer=model.tokenizer)
  task_models.save(directory, "tagging", run_config, params, info)
