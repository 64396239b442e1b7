"""Sequence-tagging data: CoNLL column files (`conll:DIR`) and tfds `conll2003` read into sentences of words
and tags, the label set, and windowed subword features in which each word is labeled on its first subword
and scored exactly once.

Two traps of other codebases are avoided here (DESIGN §5.14): labels on every subword (which inflates
scores; `task.label_all_subwords` trains on them but never scores them) and truncation of long sentences
(gold words past the window go unscored): a sentence longer than the window is split into overlapping
windows `task.window_stride` subwords apart, and each word is scored from the window where it has the most
context on both sides (BERT's SQuAD max-context rule).
"""

import dataclasses
import os

import numpy as np

from bertjax.core.errors import UserError
from bertjax.finetune.tagging import metrics as tag_metrics
from bertjax.hf.tokenizers import HFTokenizer

DOCSTART = "-DOCSTART-"


@dataclasses.dataclass
class Sentences:
  """The words and gold tags of one split, and where each word came from (for error messages)."""

  words: list  # list of lists of str
  tags: list  # list of lists of str, parallel to words
  lines: list  # 1-based line number of each word ([] for tfds)
  path: str  # the file (or tfds name:split)


def read_conll(path: str, task) -> Sentences:
  """One CoNLL column file: whitespace-separated columns, one word a line, blank or whitespace-only lines
  between sentences, `-DOCSTART-` lines skipped; the word in column task.token_column, the tag in
  task.tag_column (negative counts from the end). U+FEFF (a stray byte-order mark, as in WNUT-17's dev file)
  is dropped wherever it stands; task.strip_token_prefix is removed from each word (WikiANN's `en:`).
  UserError naming the file and line for a missing or empty file and for a line whose column count
  differs from the file's first line."""
  if not os.path.isfile(path):
    raise UserError(f"{path}:0: no such file; point --config.task.source=conll:DIR at a directory holding "
                    "task.train_file and task.eval_file")
  words, tags, lines, cur, ncols = [], [], [], ([], [], []), None
  prefix = task.get("strip_token_prefix", "")

  def flush():
    if cur[0]:
      for out, part in zip((words, tags, lines), cur):
        out.append(list(part))
      for part in cur:
        part.clear()

  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, 1):
      cols = line.replace("\ufeff", "").split()
      if not cols:
        flush()
        continue
      if cols[0] == DOCSTART:
        flush()
        continue
      if ncols is None:
        ncols = len(cols)
        for what, col in (("token_column", task.token_column), ("tag_column", task.tag_column)):
          if not -ncols <= col < ncols:
            raise UserError(f"{path}:{number}: {ncols} columns, so task.{what}={col} is out of range")
      if len(cols) != ncols:
        raise UserError(f"{path}:{number}: {len(cols)} columns where the file's first line has {ncols}; "
                        "fix the line (a token with a space in it?)")
      word = cols[task.token_column]
      if prefix and word.startswith(prefix):
        word = word[len(prefix):]
      cur[0].append(word)
      cur[1].append(cols[task.tag_column])
      cur[2].append(number)
  flush()
  if not words:
    raise UserError(f"{path}:1: no tagged words in the file; is it a CoNLL column file?")
  return Sentences(words, tags, lines, path)


def read_tfds(name: str, split: str, task) -> Sentences:
  """A tfds tagging split (conll2003: features `tokens` and `ner`, `pos` or `chunks`, chosen by
  task.tfds_tag_feature), tag ids mapped to the dataset's own ClassLabel names."""
  from bertjax.data import sources

  tfds = sources.import_tfds()
  feature = task.tfds_tag_feature
  names = tfds.builder(name).info.features[feature].feature.names
  words, tags = [], []
  for ex in sources.tfds_examples(tfds, name, split, ""):
    tokens = [t.decode("utf-8") if isinstance(t, bytes) else str(t) for t in ex["tokens"]]
    if tokens:
      words.append(tokens)
      tags.append([names[int(i)] for i in ex[feature]])
  if not words:
    raise UserError(f"tfds {name}:{split}:0: no sentences; choose another split")
  return Sentences(words, tags, [], f"tfds {name}:{split}")


def read_split(task, train: bool) -> Sentences:
  """The training or evaluation sentences of task.source (conll:DIR or tfds:NAME)."""
  kind, _, arg = task.source.partition(":")
  if kind == "conll" and arg:
    return read_conll(os.path.join(arg, task.train_file if train else task.eval_file), task)
  if kind == "tfds" and arg:
    return read_tfds(arg, task.get("train_split", "train") if train else task.eval_split, task)
  raise UserError(f"unknown tagging source {task.source!r}; use --config.task.source=conll:DIR or tfds:conll2003")


def subsample(s: Sentences, n: int, seed: int) -> Sentences:
  """A fixed random subset of n sentences in file order (all of them when n is 0 or at least the split)."""
  if not n or n >= len(s.words):
    return s
  idx = np.sort(np.random.default_rng(seed).choice(len(s.words), n, replace=False))
  pick = lambda xs: [xs[i] for i in idx] if xs else xs
  return Sentences(pick(s.words), pick(s.tags), pick(s.lines), s.path)


def label_set(train: Sentences) -> list:
  """The tag names in id order: those of the training split, sorted (as transformers' run_ner)."""
  return sorted({t for s in train.tags for t in s})


def check_tags(s: Sentences, labels: list, train_path: str) -> None:
  """UserError at the first tag of `s` that the training split never had (it could never be predicted)."""
  known = set(labels)
  for i, sent in enumerate(s.tags):
    for j, tag in enumerate(sent):
      if tag not in known:
        where = f"{s.path}:{s.lines[i][j]}" if s.lines else f"{s.path}:sentence {i}"
        raise UserError(f"{where}: tag {tag!r} never occurs in the training data {train_path}; the model "
                        "cannot predict it (train on a file that has it)")


def scheme_of(task, train: Sentences) -> str:
  """task.tag_scheme, or the training tags' scheme when it is auto."""
  if task.tag_scheme not in tag_metrics.SCHEMES:
    raise UserError(f"task.tag_scheme={task.tag_scheme!r}; use one of {', '.join(tag_metrics.SCHEMES)}")
  return tag_metrics.detect_scheme(train.tags) if task.tag_scheme == "auto" else task.tag_scheme


def word_pieces(tok, words: list, cache: dict | None = None) -> list:
  """Each word's subword ids, as transformers tokenizes words given one by one (`is_split_into_words`):
  a word starts after a space (byte-level BPE needs it to pick RoBERTa's word-initial pieces; WordPiece
  and SentencePiece ignore it), and a word that tokenizes to nothing (a lone control character) becomes
  [UNK], so that it keeps a position and is still scored."""
  cache = {} if cache is None else cache
  missing = [w for w in dict.fromkeys(words) if w not in cache]
  if missing:
    if isinstance(tok, HFTokenizer):
      encoded = [e.ids for e in tok._tok.encode_batch([" " + w for w in missing], add_special_tokens=False)]
    else:
      encoded = [list(tok.encode(w)[0]) for w in missing]
    cache.update({w: ids or [tok.special.unk] for w, ids in zip(missing, encoded)})
  return [cache[w] for w in words]


def window_starts(n_tokens: int, capacity: int, stride: int) -> list:
  """Start offsets of the windows over a sentence of n_tokens subwords: one window when it fits, else
  windows every `stride` subwords until one reaches the end (BERT's SQuAD doc spans)."""
  starts, start = [], 0
  while True:
    starts.append(start)
    if start + capacity >= n_tokens:
      return starts
    start += stride


def max_context_window(position: int, starts: list, capacity: int, n_tokens: int) -> int:
  """The window in which the subword at `position` has the most context: max of min(left, right) + 0.01 x
  window length, the first window winning ties (BERT's _check_is_max_context)."""
  best, best_score = -1, -1.0
  for w, s in enumerate(starts):
    length = min(capacity, n_tokens - s)
    if s <= position < s + length:
      score = min(position - s, s + length - 1 - position) + 0.01 * length
      if score > best_score:
        best, best_score = w, score
  return best


def encode(s: Sentences, tok, labels: list, seq_len: int, stride: int, scheme: str,
           label_all_subwords: bool = False) -> dict:
  """Fixed-length windows of [CLS] subwords [SEP] over every sentence.

  Returns arrays with one row per window: input_ids, type_ids, groups (1 = real token), tag (label id;
  0 where unlabeled), tag_weight (1.0 where the loss counts: each word's first subword in every window it
  starts in, and with label_all_subwords its other subwords too), scored (the one first subword per word
  that the metric reads: its max-context window), word (index of the word a subword belongs to, -1 for
  specials and padding), sentence (the window's sentence). Every word is scored exactly once.
  `labels` may grow: label_all_subwords adds continuation tags (I-X for B-X) training never had.
  """
  capacity = seq_len - 2
  if stride < 1 or stride > capacity:
    raise UserError(f"task.window_stride={stride} must be in [1, seq_len - 2 = {capacity}]")
  index = {t: i for i, t in enumerate(labels)}
  rows = {k: [] for k in ("input_ids", "tag", "tag_weight", "scored", "word", "sentence")}
  cache = {}
  sp = tok.special
  for si, (words, tags) in enumerate(zip(s.words, s.tags)):
    pieces = word_pieces(tok, words, cache)
    ids = np.array([p for ps in pieces for p in ps], np.int32)
    word = np.repeat(np.arange(len(words)), [len(ps) for ps in pieces]).astype(np.int32)
    first = np.r_[True, word[1:] != word[:-1]]
    tag_ids = np.array([index[t] for t in tags], np.int32)[word]
    if label_all_subwords:
      for k in np.nonzero(~first)[0]:
        cont = tag_metrics.continuation_tag(tags[word[k]], scheme)
        if cont not in index:
          index[cont] = len(labels)
          labels.append(cont)
        tag_ids[k] = index[cont]
    n = len(ids)
    starts = window_starts(n, capacity, stride)
    best = {int(p): max_context_window(int(p), starts, capacity, n) for p in np.nonzero(first)[0]}
    for w, start in enumerate(starts):
      span = slice(start, start + capacity)
      m = len(ids[span])
      pad = lambda x, fill: np.r_[fill, x, [fill] * (seq_len - 1 - m)].astype(x.dtype)
      rows["input_ids"].append(np.r_[sp.cls, ids[span], sp.sep, [sp.pad] * (seq_len - 2 - m)].astype(np.int32))
      positions = np.arange(start, start + m)
      scored = np.array([best.get(int(p), -1) == w for p in positions])
      weight = (first[span] | label_all_subwords).astype(np.float32)
      rows["tag"].append(pad(tag_ids[span], 0))
      rows["tag_weight"].append(pad(weight, 0.0))
      rows["scored"].append(pad(scored, False))
      rows["word"].append(pad(word[span], -1))
      rows["sentence"].append(si)
  out = {k: np.stack(v) if k != "sentence" else np.asarray(v, np.int32) for k, v in rows.items()}
  lengths = (out["word"] >= 0).sum(1) + 2
  out["groups"] = (np.arange(seq_len)[None] < lengths[:, None]).astype(np.int32)
  out["type_ids"] = np.zeros_like(out["input_ids"])
  return out


def word_predictions(arrays: dict, predicted: np.ndarray, s: Sentences) -> list:
  """Per-sentence lists of predicted label ids, one per word, read from each word's scored subword;
  `predicted` [windows, seq_len] holds the predicted label id of every position."""
  out = [np.full(len(w), -1, np.int64) for w in s.words]
  rows, cols = np.nonzero(arrays["scored"])
  for r, c in zip(rows, cols):
    out[arrays["sentence"][r]][arrays["word"][r, c]] = predicted[r, c]
  if any((o < 0).any() for o in out):
    raise AssertionError("a word was not scored; the windows do not cover every sentence")
  return [o.tolist() for o in out]
