"""The squad family's part of `python -m bertjax.finetune.predict`: answers to the questions of a SQuAD JSON file
(answers not needed) or to one --question over a --context, through the SQuAD windows and post-processing of
training and the settings the model was fine-tuned with (qa.json; run_squad.py's defaults for an HF model)."""

import numpy as np

from bertjax.core.errors import UserError
from bertjax.finetune import predict as cli
from bertjax.finetune.squad import data as squad_data, features as squad_features, post as squad_post
from bertjax.finetune.tasks import TOKEN_FIELDS

# run_squad.py's defaults, for a model without its own settings (an HF *ForQuestionAnswering directory).
DEFAULTS = dict(version="2.0", doc_stride=128, max_query_length=64, n_best_size=20, max_answer_length=30,
                null_score_diff_threshold=0.0, seq_len=384)
SHOWN_NBEST = 5  # n-best entries a JSON line shows (nbest_predictions.json has them all)


def read_inputs(args, ft_config) -> list:
  """The questions to answer (squad.data.Question), read and checked before the model is loaded."""
  del ft_config
  cli.only_flags(args, ("input", "question", "context"), "squad")
  if args.input:
    return squad_data.read_json(args.input, labeled=False)[0]
  if not args.question or not args.context:
    raise UserError("a squad model answers --question over --context (both), or the questions of --input=FILE.json")
  return [squad_data.Question("q", args.question, args.context, (), -1, True)]


def answers(model, params, tokenizer, questions: list, settings: dict, batch_size: int = 32) -> tuple:
  """(predictions qid -> text, nbest qid -> entries, null odds qid -> float) of `questions` from a SpanQA."""
  from bertjax.finetune import train

  s = {**DEFAULTS, **settings}
  w = squad_features.build(questions, tokenizer, s["seq_len"], s["doc_stride"], s["max_query_length"])
  out = train.predict(params, {k: w.arrays[k] for k in TOKEN_FIELDS}, model, batch_size)
  start, end = squad_post.span_logits(np.asarray(out, np.float32))
  return squad_post.predict(questions, w, start, end, s["n_best_size"], s["max_answer_length"],
                            s["version"] == "2.0", s["null_score_diff_threshold"])


def predict(tm, questions: list, args, ft_config) -> dict:
  """Answers with the model's own settings (--seq_len overrides its window length)."""
  del ft_config
  settings = dict(tm.info, **({"seq_len": args.seq_len} if args.seq_len else {}))
  preds, nbest, odds = answers(tm.model, tm.params, tm.tokenizer, questions, settings, args.batch_size)
  return dict(questions=questions, preds=preds, nbest=nbest, odds=odds)


def records(result: dict) -> list:
  """One object per question: id, answer ("" when a v2.0 model's null odds exceed its threshold), null odds
  (None under v1.1) and the best n-best entries."""
  return [dict(id=q.qid, answer=result["preds"][q.qid], null_odds=result["odds"].get(q.qid),
               nbest=result["nbest"][q.qid][:SHOWN_NBEST]) for q in result["questions"]]


def write(directory: str, result: dict) -> list:
  """predictions.json, nbest_predictions.json and (v2.0) null_odds.json, as fine-tuning writes them (what
  `python -m bertjax.finetune.squad.evaluate` scores); returns their paths."""
  return list(squad_post.write(directory, result["preds"], result["nbest"], result["odds"]).values())
