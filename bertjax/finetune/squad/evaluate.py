"""The official SQuAD v1.1 and v2.0 metrics (evaluate-v1.1.py / evaluate-v2.0.py definitions) and a CLI
that scores a predictions file with the official scripts' output keys.

  python -m bertjax.finetune.squad.evaluate DATA.json PREDICTIONS.json [--na_prob_file=NULL_ODDS.json]
      [--na_prob_thresh=1.0] [--version=auto|1.1|2.0]

Semantics follow the official scripts exactly (normalization, token F1, maximum over gold answers, v2.0's
no-answer threshold and best-threshold search), with one deliberate difference: a question without a
prediction is an error under both versions (v1.1 scored it 0 with a warning, v2.0 silently left it out of
the total, so the two scripts disagreed and a partial file looked better than it was).
"""

import collections
import json
import re
import string
import sys

from bertjax.core.errors import UserError

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b", re.UNICODE)


def normalize_answer(s: str) -> str:
  """Lowercase, drop ASCII punctuation, replace the articles a/an/the by a space, collapse whitespace
  (in this order, as both official scripts do)."""
  s = "".join(ch for ch in s.lower() if ch not in _PUNCTUATION)
  return " ".join(_ARTICLES.sub(" ", s).split())


def answer_tokens(s: str) -> list:
  """The normalized tokens F1 counts (none for an empty answer)."""
  return normalize_answer(s).split() if s else []


def exact(gold: str, pred: str) -> int:
  """1 when the normalized strings are equal, else 0."""
  return int(normalize_answer(gold) == normalize_answer(pred))


def f1(gold: str, pred: str, empty_agree: bool = True) -> float:
  """Token-overlap F1 of the normalized answers. `empty_agree` (v2.0's rule): when either side normalizes to
  nothing (a no-answer), 1 if both do, else 0. evaluate-v1.1.py has no such rule: no common token scores 0,
  so a gold answer that normalizes to nothing (e.g. "the") scores F1 0 against an empty prediction, though
  its exact match is 1."""
  g, p = answer_tokens(gold), answer_tokens(pred)
  if empty_agree and (not g or not p):
    return float(g == p)
  same = sum((collections.Counter(g) & collections.Counter(p)).values())
  if not same:
    return 0.0
  precision, recall = same / len(p), same / len(g)
  return 2 * precision * recall / (precision + recall)


def questions(dataset: list):
  """(qid, gold answer texts) of every question of a SQuAD `data` list, in file order."""
  for article in dataset:
    for paragraph in article["paragraphs"]:
      for qa in paragraph["qas"]:
        yield qa["id"], [a["text"] for a in qa["answers"]]


def _check_predicted(qids: list, predictions: dict, what: str = "predictions"):
  missing = [q for q in qids if q not in predictions]
  if missing:
    raise UserError(f"{len(missing)} of {len(qids)} questions have no entry in the {what} (first: {missing[0]}); "
                    "every question needs one (use \"\" for no answer)")


def evaluate_v1(dataset: list, predictions: dict) -> dict:
  """evaluate-v1.1.py: {'exact_match', 'f1'} in percent, each the maximum over the gold answers."""
  golds = list(questions(dataset))
  _check_predicted([q for q, _ in golds], predictions)
  em = sum(max(exact(g, predictions[q]) for g in answers) for q, answers in golds)
  f = sum(max(f1(g, predictions[q], empty_agree=False) for g in answers) for q, answers in golds)
  total = max(len(golds), 1)
  return {"exact_match": 100.0 * em / total, "f1": 100.0 * f / total}


def raw_scores_v2(dataset: list, predictions: dict) -> tuple[dict, dict, dict]:
  """(qid -> has answer, qid -> exact, qid -> f1) before any no-answer threshold. Gold answers that
  normalize to nothing are dropped; a question left with none is scored against "" (v2.0's rule)."""
  has_ans, ex, f = {}, {}, {}
  golds = list(questions(dataset))
  _check_predicted([q for q, _ in golds], predictions)
  for qid, answers in golds:
    has_ans[qid] = bool(answers)
    answers = [a for a in answers if normalize_answer(a)] or [""]
    ex[qid] = max(exact(a, predictions[qid]) for a in answers)
    f[qid] = max(f1(a, predictions[qid]) for a in answers)
  return has_ans, ex, f


def _apply_threshold(scores: dict, na_probs: dict, has_ans: dict, thresh: float) -> dict:
  """A question whose null odds exceed `thresh` counts as predicted unanswerable: 1 if it is, else 0."""
  return {q: float(not has_ans[q]) if na_probs[q] > thresh else s for q, s in scores.items()}


def _summary(ex: dict, f: dict, qids: list) -> dict:
  total = len(qids)
  return {"exact": 100.0 * sum(ex[q] for q in qids) / total, "f1": 100.0 * sum(f[q] for q in qids) / total,
          "total": total}


def best_threshold(predictions: dict, scores: dict, na_probs: dict, has_ans: dict) -> tuple[float, float]:
  """(best score in percent, its threshold): the official sweep. Start with every question predicted
  unanswerable, then admit questions in increasing order of null odds; keep the best running score."""
  score = best = sum(1 for q in scores if not has_ans[q])
  thresh = 0.0
  for qid in sorted(na_probs, key=lambda q: na_probs[q]):
    if qid not in scores:
      continue
    score += scores[qid] if has_ans[qid] else (-1 if predictions[qid] else 0)
    if score > best:
      best, thresh = score, na_probs[qid]
  return 100.0 * best / len(scores), thresh


def evaluate_v2(dataset: list, predictions: dict, na_probs: dict | None = None, na_prob_thresh: float = 1.0) -> dict:
  """evaluate-v2.0.py: exact, f1, total, HasAns_* and NoAns_* (when there are such questions) at
  `na_prob_thresh`, and, when real null odds are given, best_exact(_thresh) and best_f1(_thresh): the
  threshold tuned on this very evaluation set."""
  has_ans, ex_raw, f_raw = raw_scores_v2(dataset, predictions)
  given = na_probs is not None
  if given:
    _check_predicted(list(has_ans), na_probs, "null odds")
  odds = na_probs if given else {q: 0.0 for q in predictions}
  ex = _apply_threshold(ex_raw, odds, has_ans, na_prob_thresh)
  f = _apply_threshold(f_raw, odds, has_ans, na_prob_thresh)
  out = _summary(ex, f, list(has_ans))
  for prefix, want in (("HasAns", True), ("NoAns", False)):
    qids = [q for q, v in has_ans.items() if v == want]
    if qids:
      out.update({f"{prefix}_{k}": v for k, v in _summary(ex, f, qids).items()})
  if given:
    # The file's own order breaks ties between equal odds, as in the official sweep.
    out["best_exact"], out["best_exact_thresh"] = best_threshold(predictions, ex_raw, na_probs, has_ans)
    out["best_f1"], out["best_f1_thresh"] = best_threshold(predictions, f_raw, na_probs, has_ans)
  return out


def is_v2(data: dict) -> bool:
  """Whether a SQuAD file is v2.0: its `version` says so, or some question is marked impossible."""
  version = str(data.get("version", ""))
  if version:
    return version.lstrip("v").startswith("2")
  return any("is_impossible" in qa for art in data["data"] for p in art["paragraphs"] for qa in p["qas"])


def _load_json(path: str, what: str):
  try:
    with open(path, encoding="utf-8") as f:
      return json.load(f)
  except FileNotFoundError:
    raise UserError(f"no {what} file at {path}") from None
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise UserError(f"{path} is not valid JSON ({e}); expected a {what} file") from None


def score_files(data_path: str, pred_path: str, na_prob_file: str = "", na_prob_thresh: float = 1.0,
                version: str = "auto") -> dict:
  """The official figures of a predictions file (qid -> text) against a SQuAD data file."""
  data = _load_json(data_path, "SQuAD data")
  if not isinstance(data, dict) or not isinstance(data.get("data"), list):
    raise UserError(f"{data_path} has no top-level 'data' list; is it a SQuAD file?")
  preds = _load_json(pred_path, "predictions")
  if not isinstance(preds, dict):
    raise UserError(f"{pred_path} must hold one JSON object, question id -> answer text")
  try:
    v2 = version == "2.0" or (version == "auto" and (bool(na_prob_file) or is_v2(data)))
    if not v2:
      return evaluate_v1(data["data"], preds)
    odds = _load_json(na_prob_file, "null odds") if na_prob_file else None
    return evaluate_v2(data["data"], preds, odds, na_prob_thresh)
  except (KeyError, TypeError) as e:
    raise UserError(f"{data_path} is not SQuAD-shaped (missing or malformed {e}); check the file") from None


def main(argv: list) -> int:
  """The CLI: prints the official scripts' output keys as JSON; one-line errors and exit 2 on bad input."""
  from bertjax.core.cli import ArgumentParser

  p = ArgumentParser(prog="python -m bertjax.finetune.squad.evaluate", description=__doc__.split("\n")[0])
  p.add_argument("data_file")
  p.add_argument("pred_file")
  p.add_argument("--na_prob_file", "--na-prob-file", default="", help="v2.0: qid -> null odds (null_odds.json)")
  p.add_argument("--na_prob_thresh", "--na-prob-thresh", type=float, default=1.0,
                 help="v2.0: predict no-answer when the null odds exceed this (official default 1.0)")
  p.add_argument("--version", default="auto", choices=("auto", "1.1", "2.0"),
                 help="auto: the data file's version field (v2.0 also when --na_prob_file is given)")
  args = p.parse_args(argv)
  try:
    out = score_files(args.data_file, args.pred_file, args.na_prob_file, args.na_prob_thresh, args.version)
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  if "best_f1" in out:
    print("best_* are tuned on this evaluation set (the threshold that maximizes it), not a held-out figure",
          file=sys.stderr)
  print(json.dumps(out, indent=2))
  return 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
