"""The SQuAD task family (extractive QA, v1.1 and v2.0) as a task module of the fine-tuning trainer
(interface: bertjax.finetune.tasks, docs/finetune_tasks.md; the how-to: docs/squad.md).

Its parts, in this package: `data` reads the questions, `features` cuts them into labeled windows, `model`
holds the span head and loss, `post` turns logits into answers, `evaluate` scores them with the official
definitions and `hf` saves, loads, imports and exports models. This module wires them to the trainer's calls.
"""

import json
import os
import time

import numpy as np

from bertjax.core.errors import UserError
from bertjax.finetune.squad import (data as squad_data, evaluate as squad_eval, features as squad_features,
                                   hf as qa_io, model as qa_model, post as squad_post)
from bertjax.finetune.tasks import TOKEN_FIELDS, TaskData
from bertjax.hf import configs as hf_configs

EVAL_DATA = "eval_data.json"  # in seed_S/ when only part of the eval file is scored
OUTPUT_POSITION_AXIS = 1  # outputs are [B, S, 2 (3)]: span logits along the sequence
VERSIONS = ("1.1", "2.0")


def _check(ok: bool, message: str):
  if not ok:
    raise UserError(message)


def validate(config):
  """One-line errors for a SQuAD config that cannot run (window lengths are checked again with the
  checkpoint's own template, which RoBERTa makes one token longer)."""
  t = config.task
  _check(bool(t.source), "set --config.task.source to json:DIR (SQuAD JSON files) or tfds:squad/v1.1 (tfds:squad/v2.0)")
  _check(t.version in VERSIONS, f"task.version={t.version!r}; use 1.1 or 2.0")
  _check(t.n_best_size >= 1, f"task.n_best_size={t.n_best_size} must be at least 1")
  _check(t.max_answer_length >= 1, f"task.max_answer_length={t.max_answer_length} must be at least 1")
  _check(not t.answerable_head or t.version == "2.0", "task.answerable_head needs task.version=2.0 (v1.1 has no "
         "unanswerable questions)")
  squad_features.check_lengths(config.seq_len, t.max_query_length, t.doc_stride)


def _questions(config, train: bool) -> tuple[list, list, int]:
  """(questions, SQuAD data list, unanswerable questions dropped): v1.1 mode over a v2.0 file keeps the
  answerable questions only (reported), as v1.1's definition has no unanswerable ones."""
  t = config.task
  qs, data = squad_data.read_split(t, train)
  dropped = 0
  if t.version == "1.1" and any(q.is_impossible for q in qs):
    keep = [q for q in qs if not q.is_impossible]
    dropped = len(qs) - len(keep)
    qs, data = keep, squad_data.restrict(data, keep)
  n = t.max_train_examples if train else t.max_eval_examples
  qs, data = squad_data.subsample(qs, data, n, config.seed)
  _check(bool(qs), f"{t.source} has no {'training' if train else 'evaluation'} questions for SQuAD v{t.version}")
  return qs, data, dropped


def read(config) -> tuple:
  """(train questions, v1.1-mode drops, eval questions, eval data list, drops): both splits read and checked,
  before the trainer loads the checkpoint."""
  train_q, _, train_drop = _questions(config, True)
  eval_q, eval_data, eval_drop = _questions(config, False)
  return train_q, train_drop, eval_q, eval_data, eval_drop


def prepare(config, loaded, raw: tuple | None = None) -> TaskData:
  """Cuts both splits (`raw`, what `read` returned; read now when None) into windows of seq_len with the
  checkpoint's tokenizer and prints the first line of output: questions, windows, and the training answers no
  token span can reproduce (left out of training, as run_squad.py does, but counted here instead of silently)."""
  t, tok = config.task, loaded.tokenizer
  xlnet = hf_configs.family_if_any(loaded.config) == "xlnet"  # transformers' XLNetForQuestionAnsweringSimple
  _check(not xlnet or not (t.answerable_head or config.get("save_model", False)),
         "an XLNet checkpoint fine-tunes the simple span head only, unsaved: set --config.task.answerable_head=False "
         "and --config.save_model=False")
  squad_features.check_lengths(config.seq_len, t.max_query_length, t.doc_stride,
                               squad_features.num_special(squad_features.template(tok)))
  if not loaded.config.data.get("tokenizer"):  # a saved model (save_model) must find its tokenizer again
    loaded.config.data.tokenizer = tok.spec()
  head = qa_io.read_head(config.init.checkpoint)  # an HF *ForQuestionAnswering starts from its own span head
  if head is not None:
    loaded.params.update(head)
  train_q, train_drop, eval_q, eval_data, eval_drop = raw if raw is not None else read(config)
  tw = squad_features.build(train_q, tok, config.seq_len, t.doc_stride, t.max_query_length)
  ew = squad_features.build(eval_q, tok, config.seq_len, t.doc_stride, t.max_query_length)
  train = squad_features.training_rows(tw, train_q)
  _check(len(train["input_ids"]) > 0, "no training windows left (every answer unrecoverable?); check the data")
  answerable = sum(not q.is_impossible for q in train_q)
  dropped = f"; {train_drop + eval_drop} unanswerable questions left out (v1.1 mode)" if train_drop + eval_drop else ""
  print(f"squad v{t.version}: {len(train_q)} train questions -> {len(train['input_ids'])} windows, "
        f"{len(eval_q)} eval questions -> {len(ew.question)} windows; {len(tw.unrecoverable)} of {answerable} "
        f"training answers unrecoverable from the tokens (left out of training), {len(tw.outside)} longer than a "
        f"window (labeled [CLS]){dropped}", flush=True)
  eval_arrays = dict(ew.arrays)
  return TaskData(
      train=train, eval=eval_arrays,
      info=dict(train_examples=len(train_q), eval_examples=len(eval_q), skipped_rows=len(tw.unrecoverable),
                train_windows=len(train["input_ids"]), eval_windows=len(ew.question),
                unrecoverable_answers=len(tw.unrecoverable), answers_outside_windows=len(tw.outside),
                unanswerable_dropped=train_drop + eval_drop, version=t.version),
      model=dict(answerable_head=bool(t.answerable_head), xlnet=xlnet),
      extra=dict(questions=eval_q, windows=ew, data=eval_data,
                 subset=bool(t.max_eval_examples) or bool(eval_drop)),
      token_fields=TOKEN_FIELDS)


SETTINGS = ("version", "doc_stride", "max_query_length", "n_best_size", "max_answer_length",
            "null_score_diff_threshold")  # what a saved model answers with (predict)


def model(config, cfg, data: TaskData, deterministic: bool) -> qa_model.SpanQA:
  """The span model over the encoder `cfg` (carrying the task settings a saved model answers with)."""
  settings = tuple((k, config.task[k]) for k in SETTINGS) + (("seq_len", config.seq_len),)
  if data.model.get("xlnet"):
    return qa_model.XLNetSpanQA(cfg, deterministic=deterministic, settings=settings)
  return qa_model.SpanQA(cfg, deterministic=deterministic, answerable_head=data.model["answerable_head"],
                         settings=settings)


def init_params(model, rng, loaded) -> tuple[dict, list]:
  """(params, fresh names): embeddings and encoder pretrained; the span head from an imported
  ...ForQuestionAnswering checkpoint when it has one (loaded.params["qa_outputs"]), else from `rng`."""
  head = {k: loaded.params[k] for k in ("qa_outputs",) if k in loaded.params}
  parts = ("transformer",) if isinstance(model, qa_model.XLNetSpanQA) else ("embeddings", "encoder")
  return qa_model.init_params(model, rng, loaded.params, head, parts)


loss = qa_model.loss


def answers(outputs: np.ndarray, extra: dict, task) -> tuple[dict, dict, dict, float]:
  """(predictions, nbest, null odds, seconds) from the eval windows' outputs [N, S, 2 (3)]."""
  t0 = time.time()
  v2 = task.version == "2.0"
  start, end = squad_post.span_logits(outputs)
  preds, nbest, odds = squad_post.predict(extra["questions"], extra["windows"], start, end, task.n_best_size,
                                          task.max_answer_length, v2, task.null_score_diff_threshold)
  return preds, nbest, odds, time.time() - t0


def score(preds: dict, odds: dict, data: list, task) -> dict:
  """The official figures: v1.1 exact_match, f1; v2.0 exact, f1, total, HasAns_*, NoAns_* at the
  configured threshold (the predictions already apply it, so this equals evaluate-v2.0.py on them) and
  best_* tuned on this eval set from the real null odds."""
  if task.version == "1.1":
    return squad_eval.evaluate_v1(data, preds)
  return squad_eval.evaluate_v2(data, preds, odds, na_prob_thresh=task.null_score_diff_threshold)


def evaluate(outputs, data: TaskData, config, seed_dir: str) -> dict:
  """Post-processes the eval windows, writes seed_dir/predictions.json, nbest_predictions.json (and
  null_odds.json for v2.0; eval_data.json, the scored questions, when only a subset is), prints the post-processing time and returns the official figures."""
  task = config.task
  preds, nbest, odds, seconds = answers(np.asarray(outputs, np.float32), data.extra, task)
  squad_post.write(seed_dir, preds, nbest, odds)
  if data.extra["subset"]:  # the scored questions as a SQuAD file, so the official scripts can re-score them
    with open(os.path.join(seed_dir, EVAL_DATA), "w", encoding="utf-8") as f:
      json.dump({"version": "v2.0" if task.version == "2.0" else "1.1", "data": data.extra["data"]}, f,
                ensure_ascii=False)
  out = score(preds, odds, data.extra["data"], task)
  print(f"post-processing: {len(preds)} questions, {len(data.extra['windows'].question)} windows in {seconds:.2f}s; "
        f"wrote {os.path.join(seed_dir, 'predictions.json')}", flush=True)
  if "best_f1" in out:
    print(f"v2.0 at threshold {task.null_score_diff_threshold}: exact {out['exact']:.2f} f1 {out['f1']:.2f}; "
          f"tuned on this eval set: best_exact {out['best_exact']:.2f} (thresh {out['best_exact_thresh']:.3f}), "
          f"best_f1 {out['best_f1']:.2f} (thresh {out['best_f1_thresh']:.3f})", flush=True)
  return {k: float(v) for k, v in out.items()}


def save_model(directory: str, run_config, model, params) -> None:
  """A seed's fine-tuned SpanQA (squad.hf.load_model reads it; `python -m bertjax.finetune.predict` answers with it
  and exports it)."""
  qa_io.save_model(directory, run_config, model, params)
