"""SQuAD post-processing: from per-window start/end logits to each question's answer text, n-best list and
(v2.0) null odds, vectorized in numpy over all windows of a question, and the files the run writes."""

import json
import os

import numpy as np


def _softmax(x: np.ndarray) -> np.ndarray:
  e = np.exp(x - x.max())
  return e / e.sum()


def span_logits(outputs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """(start, end) [N, S] of SpanQA outputs [N, S, 2 (3)]. With the answerable head (channel 2) its logit
  becomes each window's null score: start[:, 0] = that logit and end[:, 0] = 0, so that null odds are the
  head's log-odds of "no answer" minus the best span's score (ELECTRA's head replaces the [CLS] score)."""
  start, end = outputs[..., 0], outputs[..., 1]
  if outputs.shape[-1] == 3:
    start, end = start.copy(), end.copy()
    start[:, 0], end[:, 0] = outputs[:, 0, 2], 0.0
  return start, end


def question_nbest(context: str, start: np.ndarray, end: np.ndarray, offsets: np.ndarray, max_ctx: np.ndarray,
                   n_best: int, max_answer_length: int, v2: bool) -> tuple[list, float]:
  """(n-best entries, null score) of one question from its windows' logits.

  start, end: [W, L] logits; offsets: [W, L, 2] context character offsets (-1 outside the context);
  max_ctx: [W, L] max-context flags. Candidates are the top n_best starts x top n_best ends of each
  window with start <= end, both in the context, at most max_answer_length tokens and the start token
  having its most context in that window; the best n_best by start + end logit with distinct texts are
  kept (text cut from the context by character offsets). v2: the null score is the minimum over windows
  of start[0] + end[0], and a "" entry with it joins the list. Each entry: text, probability (softmax
  over the list's scores), start_logit, end_logit.
  """
  W, L = start.shape
  k = min(n_best, L)
  s_idx = np.argsort(-start, axis=1, kind="stable")[:, :k]  # [W, k]
  e_idx = np.argsort(-end, axis=1, kind="stable")[:, :k]
  w = np.arange(W)[:, None, None]
  s, e = s_idx[:, :, None], e_idx[:, None, :]  # [W, k, 1], [W, 1, k] -> pairs [W, k, k]
  ok = ((offsets[w, s, 0] >= 0) & (offsets[w, e, 0] >= 0) & (e >= s) & (e - s + 1 <= max_answer_length)
        & max_ctx[w, s])
  score = start[w, s] + end[w, e]
  ww, ss, ee = np.broadcast_arrays(w, s, e)
  order = np.argsort(-score[ok], kind="stable")
  cand_w, cand_s, cand_e = ww[ok][order], ss[ok][order], ee[ok][order]
  entries, seen = [], set()
  for cw, cs, ce in zip(cand_w, cand_s, cand_e):  # at most W * k * k, stopping after n_best distinct texts
    text = context[offsets[cw, cs, 0]:offsets[cw, ce, 1]].strip()
    if text in seen:
      continue
    seen.add(text)
    entries.append(dict(text=text, start_logit=float(start[cw, cs]), end_logit=float(end[cw, ce])))
    if len(entries) >= n_best:
      break
  null = start[:, 0] + end[:, 0]
  j = int(np.argmin(null))
  null_score = float(null[j])
  if v2 and "" not in seen:
    entries.append(dict(text="", start_logit=float(start[j, 0]), end_logit=float(end[j, 0])))
  if not entries:  # nothing valid (tiny windows): run_squad's "empty" placeholder, scored 0
    entries.append(dict(text="", start_logit=0.0, end_logit=0.0))
  entries.sort(key=lambda x: -(x["start_logit"] + x["end_logit"]))  # stable: ties keep candidate order
  probs = _softmax(np.array([x["start_logit"] + x["end_logit"] for x in entries]))
  return [dict(x, probability=float(p)) for x, p in zip(entries, probs)], null_score


def predict(questions: list, windows, start_logits: np.ndarray, end_logits: np.ndarray, n_best: int,
            max_answer_length: int, v2: bool, null_threshold: float) -> tuple[dict, dict, dict]:
  """(predictions qid -> text, nbest qid -> entries, null odds qid -> float; empty under v1.1).

  v2.0 (run_squad.py's rule): null odds = null score - the best non-null entry's start + end logit; the
  answer is "" when the odds exceed `null_threshold`, else that entry's text."""
  order = np.argsort(windows.question, kind="stable")
  bounds = np.searchsorted(windows.question[order], np.arange(len(questions) + 1))
  preds, nbest, odds = {}, {}, {}
  for k, q in enumerate(questions):
    rows = order[bounds[k]:bounds[k + 1]]
    entries, null = question_nbest(q.context, start_logits[rows], end_logits[rows], windows.offsets[rows],
                                   windows.max_context[rows], n_best, max_answer_length, v2)
    nbest[q.qid] = entries
    best = next((x for x in entries if x["text"]), None)
    if not v2:
      preds[q.qid] = entries[0]["text"]
      continue
    diff = null - (best["start_logit"] + best["end_logit"]) if best else float("inf")
    odds[q.qid] = diff if best else 1e9  # JSON has no infinity: a huge finite number sorts the same
    preds[q.qid] = "" if diff > null_threshold else best["text"]
  return preds, nbest, odds


def write(directory: str, preds: dict, nbest: dict, odds: dict) -> dict:
  """Writes predictions.json, nbest_predictions.json and (v2.0) null_odds.json; returns their paths."""
  os.makedirs(directory, exist_ok=True)
  paths = {}
  for name, value in (("predictions", preds), ("nbest_predictions", nbest), ("null_odds", odds)):
    if name == "null_odds" and not value:
      continue
    paths[name] = os.path.join(directory, f"{name}.json")
    with open(paths[name], "w", encoding="utf-8") as f:
      json.dump(value, f, indent=2, ensure_ascii=False)
  return paths
