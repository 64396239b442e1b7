"""Entity and phrase spans for unit masking (ERNIE) and mention corruption (WKLM): span sources, a gazetteer,
the token arrays of a marked sentence, and WKLM's type-constrained replacement.

A span source is `data.units`, one string:
- `conll:PATH` (a file, a directory of files or a glob): CoNLL column files, one token a line, the tag in the
  last column (BIO/IOB2; an I- tag after O or another type opens a span, as IOB1 does), a whitespace-only line
  between sentences, `-DOCSTART-` between documents (without it every sentence is its own document). A
  language prefix that every token of a file carries (WikiANN's `en:`) is stripped, and so is U+FEFF.
- `jsonl:PATH`: one document a line, `{"text": "...", "spans": [[start, end, "TYPE"], ...]}` with character
  offsets (end exclusive; the type may be left out: "ENT"); the text is split into sentences (lines, then the
  sentence splitter) and a span that crosses a sentence boundary is dropped and counted.

With `data.source=units` the corpus is the span source's own text. With any other source, the span source's
mention strings form a gazetteer (`Gazetteer`) whose longest matches mark mentions in that text.

A marked sentence is `(text, spans)`, spans `((start, end, type, replaced), ...)` sorted, not overlapping.
`encode` turns it into token arrays: `unit_start` (True where a unit begins: a span's first token, the token
after a span, and outside spans every word start) and `mention` (MENTION_* bits per token).
"""

import collections
import glob
import json
import os
import random
import re

import numpy as np

from bertjax.core.errors import UserError
from bertjax.data import sources
from bertjax.data.sentences import split_sentences

KINDS = ("conll", "jsonl")
SPECS = "conll:PATH or jsonl:PATH (a file, a directory or a glob)"
DEFAULT_TYPE = "ENT"  # a JSONL span without a type
# Per-token bits of the `mention` array (uint8): a mention's first and last token, replaced mentions (WKLM's
# negatives), and every token inside a mention (MLM keeps its masks off them).
MENTION_FIRST, MENTION_LAST, MENTION_REPLACED, MENTION_INSIDE = 1, 2, 4, 8
_PREFIX = re.compile(r"^[a-z]{2,3}:(?=.)")
_WORDS = re.compile(r"\w+(?:['’-]\w+)*|[^\w\s]")  # the words a gazetteer key is made of
GAZETTEER_MAX_WORDS = 8  # longer mention strings are left out of a gazetteer


def _files(kind: str, path: str) -> list:
  """The files of a span source path: the file, a directory's regular files, or a glob's matches (sorted)."""
  path = os.path.expanduser(path)
  if os.path.isdir(path):
    files = sorted(os.path.join(path, n) for n in os.listdir(path) if os.path.isfile(os.path.join(path, n)))
  else:
    files = sorted(p for p in glob.glob(path) if os.path.isfile(p))
  if not files:
    raise UserError(f"no files match {path!r}; check the path in --config.data.units={kind}:PATH")
  return files


def parse_spec(spec: str) -> tuple:
  """(kind, files) of a `data.units` spec; UserError for a spec of another kind or without files."""
  kind, _, path = spec.partition(":")
  if kind not in KINDS or not path:
    raise UserError(f"data.units={spec!r}; use {SPECS}")
  return kind, _files(kind, path)


def fingerprint(spec: str) -> str:
  """What changes with the span files' content (path, size, mtime): part of the data cache's key."""
  _, files = parse_spec(spec)
  return ";".join(f"{p}:{os.path.getsize(p)}:{os.stat(p).st_mtime_ns}" for p in files)


def _bad(path: str, number: int, problem: str, fix: str) -> UserError:
  return UserError(f"{path}:{number}: {problem}; {fix}")


def _conll_tag(tag: str, path: str, number: int) -> tuple:
  """(prefix, type) of a CoNLL tag: ("O", "") or ("B"|"I"|"E"|"S", type)."""
  if tag == "O":
    return "O", ""
  prefix, dash, kind = tag.partition("-")
  if not dash or prefix not in ("B", "I", "E", "S") or not kind:
    raise _bad(path, number, f"tag {tag!r} is not O or B-/I-/E-/S-TYPE",
               "give the tag (BIO/IOB2/IOBES) in the last column of every token line")
  return prefix, kind


def _conll_sentence(rows: list) -> tuple:
  """A marked sentence from [(token, prefix, type)]: tokens joined by spaces, spans in characters."""
  text, spans, at, open_ = [], [], 0, None  # open_: [start, end, type] of the span being read
  for token, prefix, kind in rows:
    start = at + (1 if text else 0)
    starts = prefix in ("B", "S") or (prefix in ("I", "E") and (open_ is None or open_[2] != kind))
    if open_ is not None and (prefix == "O" or starts):
      spans.append(tuple(open_) + (False,))
      open_ = None
    if prefix != "O":
      open_ = [start, start + len(token), kind] if open_ is None else [open_[0], start + len(token), kind]
      if prefix in ("E", "S"):
        spans.append(tuple(open_) + (False,))
        open_ = None
    text.append(token)
    at = start + len(token)
  if open_ is not None:
    spans.append(tuple(open_) + (False,))
  return " ".join(text), tuple(spans)


def read_conll(path: str):
  """Yields the documents (lists of marked sentences) of one CoNLL column file."""
  with open(path, encoding="utf-8", errors="replace") as f:
    lines = [line.replace("\ufeff", "").rstrip("\n") for line in f]
  tokens = [line.split()[0] for line in lines if line.split()]
  words = [t for t in tokens if t != "-DOCSTART-"]
  strip = bool(words) and all(_PREFIX.match(t) for t in words[:100])  # WikiANN: every token is "en:..."
  if "-DOCSTART-" not in tokens:  # no document marks: every sentence is a document (WikiANN's are unrelated)
    for doc in _conll_documents(lines, path, strip):
      yield from ([sentence] for sentence in doc)
    return
  yield from _conll_documents(lines, path, strip)


def _conll_documents(lines: list, path: str, strip: bool):
  """The documents of a CoNLL file's lines, split at -DOCSTART-."""
  doc, rows = [], []
  for number, line in enumerate(lines, 1):
    columns = line.split()
    if columns and columns[0] == "-DOCSTART-":
      if rows:
        doc.append(_conll_sentence(rows))
        rows = []
      if doc:
        yield doc
      doc = []
      continue
    if not columns:
      if rows:
        doc.append(_conll_sentence(rows))
        rows = []
      continue
    if len(columns) < 2:
      raise _bad(path, number, f"line {line.strip()!r} has one column", "write 'TOKEN TAG' (tag last) on every token line")
    token = _PREFIX.sub("", columns[0]) if strip else columns[0]
    rows.append((token,) + _conll_tag(columns[-1], path, number))
  if rows:
    doc.append(_conll_sentence(rows))
  if doc:
    yield doc


def _json_spans(value, text: str, path: str, number: int) -> list:
  """The (start, end, type) spans of one JSONL document, checked against its text."""
  fix = "give spans as [start, end, \"TYPE\"] character offsets with 0 <= start < end <= len(text)"
  if not isinstance(value, list):
    raise _bad(path, number, "'spans' is not a list", fix)
  spans = []
  for span in value:
    if isinstance(span, dict):
      span = [span.get("start"), span.get("end"), span.get("type", DEFAULT_TYPE)]
    if not isinstance(span, (list, tuple)) or len(span) not in (2, 3) or not all(isinstance(x, int) for x in span[:2]):
      raise _bad(path, number, f"span {span!r} is not [start, end, type]", fix)
    start, end = span[0], span[1]
    if not 0 <= start < end <= len(text):
      raise _bad(path, number, f"span [{start}, {end}) is outside the text of {len(text)} characters", fix)
    spans.append((start, end, str(span[2]) if len(span) == 3 else DEFAULT_TYPE))
  return spans


def _sentences_of(text: str, spans: list, stats: dict) -> list:
  """A document's text split into marked sentences (lines, then the splitter), each span moved into the one
  sentence that holds it; spans crossing a boundary (or overlapping an earlier one) are dropped and counted."""
  out, cursor, marked = [], 0, 0
  spans = sorted(spans)
  for line in text.split("\n"):
    for sentence in split_sentences(line):
      # The splitter joins whitespace runs: find each word in order to map offsets back to the text.
      words, starts = sentence.split(" "), []
      for word in words:
        cursor = text.index(word, cursor)
        starts.append(cursor)
        cursor += len(word)
      begin, end = starts[0], cursor
      local = {}  # text offset -> sentence offset, for every character of a word
      at = 0
      for word, s in zip(words, starts):
        local.update((s + k, at + k) for k in range(len(word)))
        at += len(word) + 1
      kept, last = [], -1
      for s, e, kind in spans:
        if not (begin <= s and e <= end and s >= last):
          continue
        inner = [local[k] for k in range(s, e) if k in local]  # whitespace at a span's edges is not kept
        if inner:
          kept.append((inner[0], inner[-1] + 1, kind, False))
          last = e
      out.append((sentence, tuple(kept)))
      marked += len(kept)
  stats["dropped"] = stats.get("dropped", 0) + len(spans) - marked
  return out


def read_jsonl(path: str, stats: dict):
  """Yields the documents (lists of marked sentences) of one JSONL file; counts crossing spans in stats."""
  with open(path, encoding="utf-8", errors="replace") as f:
    for number, line in enumerate(f, 1):
      if not line.strip():
        continue
      try:
        record = json.loads(line)
      except ValueError as e:
        raise _bad(path, number, f"not JSON ({e})", "write one {\"text\": ..., \"spans\": [...]} object a line") from e
      if not isinstance(record, dict) or not isinstance(record.get("text"), str):
        raise _bad(path, number, "no 'text' string", "write one {\"text\": ..., \"spans\": [...]} object a line")
      spans = _json_spans(record.get("spans", []), record["text"], path, number)
      doc = [s for s in _sentences_of(record["text"], spans, stats) if s[0]]
      if doc:
        yield doc


def documents(spec: str, stats: dict | None = None):
  """Yields the documents of a span source, each a list of marked sentences (text, spans)."""
  stats = {} if stats is None else stats
  kind, files = parse_spec(spec)
  for path in files:
    yield from (read_conll(path) if kind == "conll" else read_jsonl(path, stats))


def _words(text: str) -> list:
  return [(m.start(), m.end()) for m in _WORDS.finditer(text)]


class Gazetteer:
  """Mention strings of a span source and their types, matched longest-first in plain text. Strings without
  an uppercase letter are left out (WikiANN tags a few common words, which would mark most sentences)."""

  def __init__(self, spec: str):
    counts = collections.defaultdict(collections.Counter)
    for doc in documents(spec):
      for text, spans in doc:
        for s, e, kind, _ in spans:
          string = text[s:e]
          key = tuple(string[a:b] for a, b in _words(string))
          if key and len(key) <= GAZETTEER_MAX_WORDS and any(c.isupper() for c in text[s:e]):
            counts[key][kind] += 1
    # The type a string has most often (ties: the first in sorted order, so the choice is the same every run).
    self.types = {k: min(c.items(), key=lambda kv: (-kv[1], kv[0]))[0] for k, c in counts.items()}
    self.longest = max((len(k) for k in self.types), default=0)

  def __len__(self) -> int:
    return len(self.types)

  def mark(self, sentence: str) -> tuple:
    """The marked sentence: the longest gazetteer match at each word, left to right, matches not overlapping."""
    words, spans, i = _words(sentence), [], 0
    while i < len(words):
      for n in range(min(self.longest, len(words) - i), 0, -1):
        kind = self.types.get(tuple(sentence[a:b] for a, b in words[i:i + n]))
        if kind is not None:
          spans.append((words[i][0], words[i + n - 1][1], kind, False))
          i += n
          break
      else:
        i += 1
    return sentence, tuple(spans)


def corrupt(docs: list, rng, replace_prob: float) -> tuple:
  """WKLM's negatives (Xiong et al. 2020, §2.1): in every document, each mention is replaced, with probability
  `replace_prob`, by the string of another mention of the same type drawn uniformly from those of `docs` (the
  work unit, as NSP draws its random segments from it), never right after a mention that was replaced (no two
  adjacent replacements) and never by the same string (compared case-insensitively; a mention with no other
  string of its type stays). Returns (documents with the new texts and spans, replaced count)."""
  pool = collections.defaultdict(dict)  # type -> {string: None}: distinct strings in corpus order
  for doc in docs:
    for text, spans in doc:
      for s, e, kind, _ in spans:
        pool[kind].setdefault(text[s:e], None)
  pool = {kind: list(strings) for kind, strings in pool.items()}
  out, replaced = [], 0
  for doc in docs:
    new_doc, previous = [], False
    for text, spans in doc:
      pieces, new_spans, at, cursor = [], [], 0, 0
      for s, e, kind, _ in spans:
        original = text[s:e]
        swap = not previous and rng.random() < replace_prob
        others = [x for x in pool[kind] if x.lower() != original.lower()] if swap else []
        string = others[rng.randrange(len(others))] if others else original
        previous = bool(others)
        replaced += previous
        pieces.append(text[cursor:s])
        at += s - cursor
        new_spans.append((at, at + len(string), kind, previous))
        pieces.append(string)
        at += len(string)
        cursor = e
      pieces.append(text[cursor:])
      new_doc.append(("".join(pieces), tuple(new_spans)))
    out.append(new_doc)
  return out, replaced


def encode(tok, sentence: tuple, stats: dict) -> tuple:
  """(ids, word_start, unit_start, mention) of a marked sentence. A span covers the tokens its characters
  overlap; a span that covers no token, or shares one with an earlier span, is dropped and counted
  (stats["unaligned"]); stats["spans"] counts the spans marked."""
  text, spans = sentence
  ids, word_start = tok.encode(text)
  unit_start, mention = word_start.copy(), np.zeros(len(ids), np.uint8)
  if not spans or not len(ids):
    return ids, word_start, unit_start, mention
  ids2, offsets = tok.encode_offsets(text)
  if len(ids2) != len(ids) or np.any(ids2 != ids):  # "[MASK]" written in the text: no offsets to trust
    stats["unaligned"] = stats.get("unaligned", 0) + len(spans)
    return ids, word_start, unit_start, mention
  taken = np.zeros(len(ids), bool)
  for s, e, _, replaced in spans:
    hit = np.flatnonzero((offsets[:, 0] < e) & (offsets[:, 1] > s))
    if not len(hit) or taken[hit].any():
      stats["unaligned"] = stats.get("unaligned", 0) + 1
      continue
    a, b = hit[0], hit[-1] + 1
    taken[a:b] = True
    unit_start[a], unit_start[a + 1:b] = True, False
    if b < len(ids):
      unit_start[b] = True
    mention[a:b] |= MENTION_INSIDE | (MENTION_REPLACED if replaced else 0)
    mention[a] |= MENTION_FIRST
    mention[b - 1] |= MENTION_LAST
    stats["spans"] = stats.get("spans", 0) + 1
  return ids, word_start, unit_start, mention


def whole_mentions(mention: np.ndarray) -> np.ndarray:
  """`mention` with the tokens of every mention cut by truncation zeroed (a mention is whole when its first
  token and its last token are both there): the boundary pairs stay in step."""
  out = mention.copy()
  inside = (out & MENTION_INSIDE) > 0
  i, n = 0, len(out)
  while i < n:
    if not inside[i]:
      i += 1
      continue
    j = i
    while j < n and inside[j] and (j == i or not out[j] & MENTION_FIRST):
      j += 1
    if not (out[i] & MENTION_FIRST and out[j - 1] & MENTION_LAST):
      out[i:j] = 0
    i = j
  return out


# What data preparation (bertjax.data.prepare_lib) asks of a run with spans.

def text_of(line) -> str:
  """The text of a raw line: a string, or a marked sentence (text, spans) of a span source."""
  return line if isinstance(line, str) else line[0]


def units_mode(config) -> str:
  """How a run's rows get entity/phrase spans: "" (none), "spans" (data.source=units: the span source's own
  text) or "gazetteer" (the span source's mention strings matched in data.source's text)."""
  d = config.data
  if not d.get("units", ""):
    if d.source == "units":
      raise UserError("data.source=units trains on the text of a span source; set --config.data.units=conll:PATH "
                      "or jsonl:PATH")
    return ""
  return "spans" if d.source == "units" else "gazetteer"


def replace_prob(config) -> float:
  """WKLM's share of replaced mentions, where the wklm objective is on (else 0: rows are not corrupted)."""
  from bertjax.core.config import active_objectives  # imports JAX: main process only

  return float(config.wklm.replace_prob) if "wklm" in active_objectives(config) else 0.0


def open_reader(config):
  """The Reader of config.data.source; `units` reads the documents of data.units (marked sentences)."""
  d = config.data
  if d.source == "units" and units_mode(config):
    parse_spec(d.units)  # UserError for a bad spec before anything is read
    return sources.Reader(f"units:{d.units}", False, 0, "documents", lambda stats: _counted(documents(d.units), stats))
  return sources.open_source(d.source, split_paragraphs=d.split_paragraphs, tfds_text_key=d.tfds_text_key,
                             tfds_data_dir=d.tfds_data_dir)


def _counted(docs, stats: sources.SourceStats):
  for doc in docs:
    stats.documents += 1
    stats.progress += 1
    yield doc


def marked_chunk(settings, docs: list, seed: int, counts: dict) -> list:
  """A chunk's documents as marked sentences: the span source's, or the gazetteer's matches in the split
  sentences; with WKLM, mentions replaced (units.corrupt)."""
  if settings.units == "gazetteer":
    docs = [[settings.gazetteer.mark(s) for s in sources.to_sentences(lines, settings.paragraphs)] for lines in docs]
  if settings.replace_prob > 0:
    docs, counts["replaced"] = corrupt(docs, random.Random(seed), settings.replace_prob)
  return docs


def describe(meta: dict) -> str:
  """The line that shows a preparation's entity/phrase spans: how many were marked, how many could not be
  placed on tokens, and (WKLM) the share of mentions replaced."""
  u, c = meta["units"], meta["counts"]
  spans = c["train"].get("spans", 0) + c["eval"].get("spans", 0)
  unaligned = c["train"].get("unaligned_spans", 0) + c["eval"].get("unaligned_spans", 0)
  line = (f"units from {u['spec']} ({u['mode']}" + (f", gazetteer of {u['gazetteer']:,} strings" if u["gazetteer"] else "")
          + f"): {spans:,} spans marked on tokens, {unaligned:,} dropped (no token of their own)")
  if u["replace_prob"]:
    replaced = c["train"].get("replaced_mentions", 0) + c["eval"].get("replaced_mentions", 0)
    line += f"; WKLM replaced {replaced:,} mentions ({replaced / max(spans, 1):.1%}; p={u['replace_prob']})"
  return line
