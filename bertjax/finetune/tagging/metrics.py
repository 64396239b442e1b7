"""Sequence-tagging metrics with conlleval's semantics: entity chunks, their precision/recall/F1 (overall and
per type), token accuracy, tag-scheme detection (IOB1, IOB2/BIO, BIOES) and conlleval's input file.

Chunks follow conlleval.pl (and seqeval's default mode, which transcribes it): one function reads IOB1,
IOB2 and BIOES alike. A chunk starts at B-/S-, at an I-/E- after O or after a chunk that ended, and
wherever the type changes; it ends before O, B-, S-, a type change, and after E-/S-. So an `I-` with no
`B-` before it starts an entity (conlleval), not nothing (some hand-written scorers), and IOB1 data, whose
entities mostly start with I-, is scored as its authors meant. Hand-written scorers that disagree with
conlleval there were a known trap (transformers' examples before seqeval).
"""

import os

import numpy as np

SCHEMES = ("auto", "iob1", "iob2", "bioes", "none")
_PREFIXES = ("B", "I", "E", "S")


def split_tag(tag: str) -> tuple[str, str]:
  """(prefix, type) as conlleval splits a tag: "B-PER" -> ("B", "PER"); a bare prefix ("B", and "O") has
  type "_" as in seqeval; anything else is (its first character, the rest after the first "-")."""
  return tag[:1], tag[1:].split("-", 1)[-1] or "_"


def entities(tags) -> list[tuple[str, int, int]]:
  """(type, first, last) of every chunk of one sentence's tags (inclusive word indices), in order."""
  chunks, prev_tag, prev_type, begin = [], "O", "", 0
  for i, tag in enumerate(list(tags) + ["O"]):
    t, kind = split_tag(tag)
    end = (prev_tag in ("E", "S") or (prev_tag in ("B", "I") and t in ("B", "S", "O"))
           or (prev_tag not in ("O", ".") and prev_type != kind))
    start = (t in ("B", "S") or (prev_tag in ("E", "S", "O") and t in ("E", "I"))
             or (t not in ("O", ".") and prev_type != kind))
    if end:
      chunks.append((prev_type, begin, i - 1))
    if start:
      begin = i
    prev_tag, prev_type = t, kind
  return chunks


def _f1(tp: int, n_pred: int, n_gold: int) -> tuple[float, float, float]:
  precision = tp / n_pred if n_pred else 0.0
  recall = tp / n_gold if n_gold else 0.0
  return precision, recall, (2 * precision * recall / (precision + recall) if tp else 0.0)


def score(gold: list, pred: list, scheme: str = "iob2") -> dict:
  """Metrics of predicted against gold tag sequences (lists of per-sentence tag lists, same shapes).

  Returns f1, precision, recall (micro over entity chunks; conlleval's overall line), accuracy (tokens),
  and `per_type`: type -> dict(precision, recall, f1, support). With scheme "none" (tags without chunk
  prefixes, e.g. POS) there are no chunks: precision = recall = f1 = accuracy (micro-averaged over tokens).
  """
  if len(gold) != len(pred) or any(len(g) != len(p) for g, p in zip(gold, pred)):
    raise ValueError("gold and predicted tags differ in shape")
  flat_g = np.array([t for s in gold for t in s], object)
  flat_p = np.array([t for s in pred for t in s], object)
  accuracy = float(np.mean(flat_g == flat_p)) if len(flat_g) else 0.0
  if scheme == "none":
    return dict(f1=accuracy, precision=accuracy, recall=accuracy, accuracy=accuracy, per_type={})
  true, found = set(), set()
  for i, (g, p) in enumerate(zip(gold, pred)):
    true |= {(i,) + c for c in entities(g)}
    found |= {(i,) + c for c in entities(p)}
  hits = true & found
  precision, recall, f1 = _f1(len(hits), len(found), len(true))
  per_type = {}
  for kind in sorted({c[1] for c in true | found}):
    count = lambda chunks: sum(c[1] == kind for c in chunks)
    p, r, f = _f1(count(hits), count(found), count(true))
    per_type[kind] = dict(precision=p, recall=r, f1=f, support=count(true))
  return dict(f1=f1, precision=precision, recall=recall, accuracy=accuracy, per_type=per_type)


def detect_scheme(sentences) -> str:
  """The tag scheme of gold tag sequences: "none" when some tag lacks a B-/I-/E-/S- prefix (and is not O:
  POS tags), "bioes" when E- or S- occur, "iob1" when an I- starts an entity (after O, at a sentence
  start or after another type: IOB1 writes B- only between two adjacent entities of one type), else "iob2"."""
  tags = {t for s in sentences for t in s}
  if any(t != "O" and not (t[:1] in _PREFIXES and t[1:2] == "-" and len(t) > 2) for t in tags):
    return "none"
  if any(t[:1] in ("E", "S") for t in tags):
    return "bioes"
  for s in sentences:
    prev = "O"
    for t in s:
      if t.startswith("I-") and (prev == "O" or prev[2:] != t[2:]):
        return "iob1"
      prev = t
  return "iob2"


def continuation_tag(tag: str, scheme: str) -> str:
  """The tag of a word's second and later subwords when every subword is labeled (task.label_all_subwords):
  I- of the word's type, inside the entity the first subword opens or continues. B- must not be repeated
  (transformers#14043 did: each piece would open an entity, and IOB1's B- would too); for a BIOES E-/S- word
  this writes piece sequences like E-X I-X, which only the training loss sees: scoring reads first subwords."""
  if scheme == "none" or tag == "O":
    return tag
  prefix, kind = split_tag(tag)
  return f"I-{kind}" if prefix in _PREFIXES else tag


def write_conll(path: str, words: list, gold: list, pred: list) -> None:
  """conlleval's input: one `token gold predicted` line per word, a blank line after each sentence."""
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  with open(path, "w", encoding="utf-8") as f:
    for ws, gs, ps in zip(words, gold, pred):
      for w, g, p in zip(ws, gs, ps):
        f.write(f"{w} {g} {p}\n")
      f.write("\n")


def read_conll_predictions(path: str) -> tuple[list, list, list]:
  """(words, gold, predicted) per sentence of a file written by `write_conll`."""
  words, gold, pred, cur = [], [], [], ([], [], [])
  with open(path, encoding="utf-8") as f:
    for line in f:
      cols = line.split()
      if not cols:
        if cur[0]:
          for out, col in zip((words, gold, pred), cur):
            out.append(col)
        cur = ([], [], [])
        continue
      for col, value in zip(cur, cols):
        col.append(value)
  if cur[0]:
    for out, col in zip((words, gold, pred), cur):
      out.append(col)
  return words, gold, pred
