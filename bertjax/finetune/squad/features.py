"""SQuAD windows: `[CLS] question [SEP] context chunk [SEP]` rows of fixed length over a context longer than
one row, their span labels from the tokenizer's character offsets, and BERT's max-context flags.

Windows step over the context by `doc_stride` tokens (google-research/bert run_squad.py; transformers'
run_qa.py calls the overlap its stride instead). A training answer is labeled in each window that holds it
whole; other windows, and unanswerable questions, are labeled at position 0 ([CLS]), as both do.
"""

import dataclasses

import numpy as np

from bertjax.core.errors import UserError
from bertjax.finetune.squad.evaluate import normalize_answer


@dataclasses.dataclass
class Windows:
  """All windows of a list of questions.

  arrays: model inputs and labels, [N, seq_len] input_ids, type_ids, groups (1 = real token) and [N]
    start_position, end_position (0 = [CLS]), is_impossible (1.0 when the window has no answer).
  question: [N] index of the window's question.
  offsets: [N, seq_len, 2] character offsets of each context token in its question's context, -1 elsewhere.
  max_context: [N, seq_len] whether this window gives the token its most context (BERT's rule).
  unrecoverable: ids of answerable questions whose answer no token span reproduces (official EM 0 at
    best); dropped from training, counted and reported.
  outside: ids of answerable questions whose answer fits in no window (all their windows label [CLS]).
  """

  arrays: dict
  question: np.ndarray
  offsets: np.ndarray
  max_context: np.ndarray
  unrecoverable: list
  outside: list


def template(tokenizer) -> dict:
  """The special tokens around question and context, with their type ids: the checkpoint's own pair
  template for HF tokenizers (RoBERTa: <s> q </s></s> c </s>), else [CLS] q [SEP] c [SEP]."""
  if hasattr(tokenizer, "pair_template"):
    return tokenizer.pair_template()
  s = tokenizer.special
  return dict(prefix=([s.cls], [0]), middle=([s.sep], [0]), suffix=([s.sep], [1]), a_type=0, b_type=1)


def num_special(tmpl: dict) -> int:
  return sum(len(tmpl[k][0]) for k in ("prefix", "middle", "suffix"))


def check_lengths(seq_len: int, max_query_length: int, doc_stride: int, n_special: int = 3):
  """One-line errors for window lengths that cannot work: the question (up to max_query_length tokens)
  and the special tokens must leave room for context, and the stride must be smaller than that room
  (else windows would skip context)."""
  room = seq_len - max_query_length - n_special
  if max_query_length < 1 or doc_stride < 1:
    raise UserError(f"task.max_query_length={max_query_length} and task.doc_stride={doc_stride} must be positive")
  if room < 1:
    raise UserError(f"seq_len={seq_len} leaves no room for context after a {max_query_length}-token question and "
                    f"{n_special} special tokens; raise --config.seq_len above {max_query_length + n_special} or "
                    "lower --config.task.max_query_length")
  if doc_stride >= room:
    raise UserError(f"task.doc_stride={doc_stride} must be smaller than the {room} context tokens a window holds "
                    f"(seq_len {seq_len} - max_query_length {max_query_length} - {n_special}); lower it")


def starts(n: int, room: int, stride: int) -> list:
  """Token offsets of the windows over an n-token context: step `stride` until one reaches the end."""
  out, start = [0], 0
  while start + room < n:
    start += min(room, stride)
    out.append(start)
  return out


def max_context(win_starts: np.ndarray, lengths: np.ndarray, n: int) -> np.ndarray:
  """[W, n]: whether window w is the one where context token i has the most context, scored
  min(left, right) + 0.01 * window length with the first best window winning (run_squad's
  _check_is_max_context), for all windows and tokens at once."""
  i = np.arange(n)[None, :]
  s, ln = win_starts[:, None], lengths[:, None]
  inside = (i >= s) & (i < s + ln)
  score = np.where(inside, np.minimum(i - s, s + ln - 1 - i) + 0.01 * ln, -np.inf)
  return inside & (np.arange(len(win_starts))[:, None] == score.argmax(0)[None, :])


def answer_tokens(offsets: np.ndarray, start: int, end: int) -> tuple[int, int]:
  """(first, last) context token covering characters [start, end); first > last when none does."""
  first = int(np.searchsorted(offsets[:, 1], start, side="right")) if len(offsets) else 0
  covering = np.nonzero(offsets[:, 0] < end)[0]
  return first, int(covering[-1]) if len(covering) else -1


def build(questions: list, tokenizer, seq_len: int, doc_stride: int, max_query_length: int) -> Windows:
  """The windows of `questions` (squad_data.Question), labeled from their first answer."""
  tmpl = template(tokenizer)
  check_lengths(seq_len, max_query_length, doc_stride, num_special(tmpl))
  (pre, pre_t), (mid, mid_t), (suf, suf_t) = tmpl["prefix"], tmpl["middle"], tmpl["suffix"]
  pad = tokenizer.special.pad
  contexts = {}  # many questions share a paragraph: tokenize each context once
  rows = dict(input_ids=[], type_ids=[], groups=[], start_position=[], end_position=[], is_impossible=[])
  qidx, offs, maxc, unrecoverable, outside = [], [], [], [], []
  for k, q in enumerate(questions):
    if q.context not in contexts:
      contexts[q.context] = tokenizer.encode_offsets(q.context)
    ids, offsets = contexts[q.context]
    q_ids = tokenizer.encode_offsets(q.question.lstrip())[0][:max_query_length]
    head = list(pre) + list(q_ids) + list(mid)
    head_t = list(pre_t) + [tmpl["a_type"]] * len(q_ids) + list(mid_t)
    room = seq_len - len(head) - len(suf)
    n = len(ids)
    first, last = -1, -1
    if not q.is_impossible:
      end_char = q.answer_start + len(q.answers[0])
      first, last = answer_tokens(offsets, q.answer_start, end_char)
      found = q.context[offsets[first, 0]:offsets[last, 1]] if first <= last else ""
      if first > last or normalize_answer(found) != normalize_answer(q.answers[0]):
        unrecoverable.append(q.qid)
        if first > last:
          first, last = -1, -1
    win = np.asarray(starts(n, room, doc_stride))
    lengths = np.minimum(room, n - win)
    best = max_context(win, lengths, n)
    if first >= 0 and not np.any((first >= win) & (last < win + lengths)):
      outside.append(q.qid)
    for w, (s, ln) in enumerate(zip(win, lengths)):
      row = np.full(seq_len, pad, np.int32)
      types = np.zeros(seq_len, np.int32)
      body = head + list(ids[s:s + ln]) + list(suf)
      row[:len(body)] = body
      types[:len(body)] = head_t + [tmpl["b_type"]] * ln + list(suf_t)
      off = np.full((seq_len, 2), -1, np.int32)
      off[len(head):len(head) + ln] = offsets[s:s + ln]
      mc = np.zeros(seq_len, bool)
      mc[len(head):len(head) + ln] = best[w, s:s + ln]
      has = first >= 0 and first >= s and last < s + ln
      rows["input_ids"].append(row)
      rows["type_ids"].append(types)
      rows["groups"].append((np.arange(seq_len) < len(body)).astype(np.int32))
      rows["start_position"].append(first - s + len(head) if has else 0)
      rows["end_position"].append(last - s + len(head) if has else 0)
      rows["is_impossible"].append(0.0 if has else 1.0)
      qidx.append(k)
      offs.append(off)
      maxc.append(mc)
  arrays = {k: np.asarray(v, np.float32 if k == "is_impossible" else np.int32) for k, v in rows.items()}
  if not qidx:
    arrays = {k: np.zeros((0, seq_len) if k in ("input_ids", "type_ids", "groups") else (0,), v.dtype)
              for k, v in arrays.items()}
  return Windows(arrays, np.asarray(qidx, np.int32), np.asarray(offs, np.int32).reshape(-1, seq_len, 2),
                 np.asarray(maxc, bool).reshape(-1, seq_len), unrecoverable, outside)


def training_rows(windows: Windows, questions: list) -> dict:
  """The arrays to train on: every window except those of unrecoverable answers (as run_squad.py skips
  them; they are counted and reported instead of hidden)."""
  bad = set(windows.unrecoverable)
  keep = np.array([questions[k].qid not in bad for k in windows.question], bool)
  return {k: v[keep] for k, v in windows.arrays.items()}
