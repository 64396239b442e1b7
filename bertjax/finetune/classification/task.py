"""The classification task family (GLUE's shapes): sentence or sentence-pair classification, and regression
(one output, MSE), as a task module of the fine-tuning trainer (the interface: bertjax.finetune.tasks).

Its parts, in this package: `data` reads and encodes the TSV / tfds splits, `model` holds the Classifier heads,
`metrics` GLUE's metrics, `hf` saved classifiers and transformers' *ForSequenceClassification, `glue` the
suite's GLUE tasks and recipes. This module only wires them to the trainer's calls.
"""

import json
import os

import numpy as np
import optax

from bertjax.core.errors import UserError
from bertjax.finetune.classification import data as task_data, metrics as task_metrics, model as task_model
from bertjax.finetune.model import init_params as pretrained_init
from bertjax.data import trees
from bertjax.finetune.tasks import TaskData, TOKEN_FIELDS
from bertjax.model import kinds
from bertjax.hf import configs as hf_configs

OUTPUT_POSITION_AXIS = None  # outputs are per example ([B, C]), no sequence axis to re-pad after length buckets


def _check(ok: bool, message: str):
  if not ok:
    raise UserError(message)


def validate(config):
  """One-line errors for a classification task config that cannot run."""
  _check(bool(config.task.source), "set --config.task.source to tsv:DIR (GLUE layout) or tfds:glue/NAME")
  unknown = [m for m in config.task.metrics.split(",") if m not in task_metrics.REGISTRY]
  _check(not unknown, f"unknown metrics {unknown}; use {', '.join(task_metrics.REGISTRY)}")
  _check(config.seq_len >= 8, f"seq_len={config.seq_len} is too short for [CLS] A [SEP] B [SEP]; use >= 8")
  heads = ("auto",) + task_model.HEADS
  _check(config.model.head in heads, f"model.head={config.model.head!r}; use {', '.join(heads)}")
  pooling = config.model.get("pooling", "auto")
  poolings = ("auto",) + task_model.POOLINGS
  _check(pooling in poolings, f"model.pooling={pooling!r}; use {', '.join(poolings)}")


def checkpoint_pooling(checkpoint: str) -> str:
  """The pooling an HF checkpoint's config.json states (ModernBERT's classifier_pooling: transformers pools the
  ModernBertForSequenceClassification head by it), else "cls" (its default; bertjax workdirs state none)."""
  path = os.path.join(checkpoint, "config.json")
  if os.path.isdir(os.path.join(checkpoint, "checkpoints")) or not os.path.isfile(path):
    return "cls"
  with open(path) as f:
    pooling = json.load(f).get("classifier_pooling", "cls")
  if pooling not in task_model.POOLINGS:
    raise UserError(f"{path} has classifier_pooling={pooling!r}; bertjax pools by {', '.join(task_model.POOLINGS)} "
                    "(set --config.model.pooling)")
  return pooling


def pooling_of(config) -> str:
  """The modernbert head's pooling: --config.model.pooling when it is cls or mean (given explicitly), else
  (auto, the default) the checkpoint's own (`checkpoint_pooling`)."""
  pooling = config.model.get("pooling", "auto")
  return checkpoint_pooling(config.init.checkpoint) if pooling == "auto" else pooling


def head_kind(config, loaded) -> str:
  """The head to build: model.head, with auto -> the checkpoint family's own sequence-classification head
  (ElectraForSequenceClassification's, RobertaForSequenceClassification's, ModernBertForSequenceClassification's,
  DistilBertForSequenceClassification's for DistilBERT's shape: no segment embeddings), else BERT's pooler."""
  family = hf_configs.family_if_any(loaded.config)  # kinds of no transformers family (tree, LSRA) get BERT's head
  if config.model.head != "auto":
    _check((config.model.head == "xlnet") == (family == "xlnet"),
           f"model.head={config.model.head!r} does not fit a {family} checkpoint; set --config.model.head=auto")
    return config.model.head
  return family if family in ("electra", "roberta", "modernbert", "distilbert", "xlnet") else "pooler"


def pretrained_pooler(loaded):
  """The checkpoint's NSP/SOP pooler (a pretraining workdir's sentence head, or an import's: BertModel's pooler,
  ModernBertForSequenceClassification's head), or None."""
  return loaded.params.get("sentence", {}).get("pooler", loaded.pooler)


def read(config) -> tuple:
  """(training examples, [evaluation examples of each eval split]): both splits read and checked (subsampled as
  task.max_*_examples say), before the trainer loads the checkpoint."""
  task = config.task
  train_ex = task_data.subsample(task_data.read_split(task, True), task.max_train_examples, config.seed)
  evals = [task_data.subsample(task_data.read_split(task, False, name), task.max_eval_examples, config.seed)
           for name in [""] + task_data.extra_eval_names(task)]
  return train_ex, evals


def prepare(config, loaded, raw: tuple | None = None) -> TaskData:
  """Encodes both splits (`raw`, what `read` returned; read now when None) to seq_len with the checkpoint's
  tokenizer: input_ids, type_ids, groups, label. Further evaluation splits (task.extra_eval, MNLI's mismatched
  dev set) are appended to the eval arrays, told apart by an `eval_split` field."""
  task = config.task
  train_ex, evals = raw if raw is not None else read(config)
  head = head_kind(config, loaded)
  _check(head != "xlnet" or not config.get("save_model", False),
         "save_model: a fine-tuned XLNet classifier cannot be saved yet (no reader for it); set "
         "--config.save_model=False")
  pooler = pretrained_pooler(loaded)
  # A model whose attention reads node spans (model.attention_kind=tree) reads bracketed trees.
  parsed = kinds.get("attention", loaded.config.model.attention_kind).inputs == trees.FIELDS
  encoded = [task_data.encode(ex, loaded.tokenizer, config.seq_len, parsed, "eval") for ex in evals]
  eval_arrays = {k: np.concatenate([e[k] for e in encoded]) for k in encoded[0]}
  if len(encoded) > 1:
    eval_arrays["eval_split"] = np.concatenate([np.full(len(e["label"]), i, np.int32) for i, e in enumerate(encoded)])
  extra_counts = {f"eval_examples_{name}": len(ex.a) for name, ex in zip(task_data.extra_eval_names(task), evals[1:])}
  pooling = "cls"  # what the other heads read: [CLS]
  if head == "modernbert":  # reported with the run: the checkpoint's own unless --config.model.pooling says
    pooling = extra_counts["pooling"] = pooling_of(config)
  return TaskData(
      train=task_data.encode(train_ex, loaded.tokenizer, config.seq_len, parsed),
      eval=eval_arrays,
      info=dict(train_examples=len(train_ex.a), eval_examples=len(evals[0].a), **extra_counts,
                skipped_rows=train_ex.skipped + sum(ex.skipped for ex in evals), head=head,
                pooler=("none" if head not in ("pooler", "modernbert")
                        or not loaded.config.model.get("pooler_activation", True)
                        else "pretrained" if pooler is not None else "fresh")),
      model=dict(num_outputs=len(task_data.label_names(task)) or 1, head=head, pooling=pooling),
      token_fields=TOKEN_FIELDS + (trees.FIELDS if parsed else ()))


def model(config, cfg, data: TaskData, deterministic: bool) -> task_model.Classifier:
  """The Classifier over the encoder `cfg` (its head and outputs as `prepare` fixed them); XLNet's own model for
  an XLNet checkpoint (its summary dropout is model.classifier_dropout)."""
  if data.model["head"] == "xlnet":
    return task_model.XLNetClassifier(cfg, data.model["num_outputs"], summary_dropout=config.model.classifier_dropout,
                                      deterministic=deterministic)
  return task_model.Classifier(cfg, data.model["num_outputs"], config.model.classifier_dropout,
                               deterministic=deterministic, head=data.model["head"],
                               pooling=data.model.get("pooling", "cls"))


def init_params(model, rng, loaded) -> tuple[dict, list]:
  """(params, names of the fresh parts): encoder and embeddings (and the pooler) pretrained, head from `rng`;
  XLNet: its transformer pretrained, the summary and logits_proj fresh."""
  if isinstance(model, task_model.XLNetClassifier):
    return pretrained_init(model, rng, loaded.params, None, parts=("transformer",))
  return pretrained_init(model, rng, loaded.params, pretrained_pooler(loaded))


def loss(outputs, batch):
  """Per-example loss [B] (packed rows: [B, slots]): squared error for one output (regression), else softmax
  cross-entropy."""
  if outputs.shape[-1] == 1:
    return (outputs[..., 0] - batch["label"]) ** 2
  return optax.softmax_cross_entropy_with_integer_labels(outputs, batch["label"])


def evaluate(outputs, data: TaskData, config, seed_dir: str) -> dict:
  """task.metrics over the eval split's outputs [N, C], and over each task.extra_eval split as
  METRIC_NAME (e.g. accuracy_mismatched); writes no files."""
  del seed_dir
  names = config.task.metrics.split(",")
  split = data.eval.get("eval_split")
  if split is None:
    return task_metrics.compute(names, outputs, data.eval["label"])
  result = {}
  for i, extra in enumerate([""] + task_data.extra_eval_names(config.task)):
    rows = split == i
    values = task_metrics.compute(names, outputs[rows], data.eval["label"][rows])
    result.update({f"{k}_{extra}" if extra else k: v for k, v in values.items()})
  return result


def save_model(directory: str, run_config, model, params) -> None:
  """A seed's fine-tuned classifier, as bertjax.compress.prune and classification.model.load_model read it, with a
  copy of its tokenizer (directory/tokenizer), so predict needs nothing else."""
  from bertjax.finetune import task_models

  run_config = run_config.copy_and_resolve_references()
  run_config.data.tokenizer = task_models.copy_tokenizer(run_config.data.tokenizer, directory)
  task_model.save_model(directory, run_config, model, params)

