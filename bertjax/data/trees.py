"""Bracketed constituency trees as rows for tree attention on given parses (bertjax.model.tree_attention): the parser
of sentences is the user's, bertjax reads its trees.

Input (`data.trees=True` with `data.source=text:GLOB`; a classification task's text column alike): one tree a line,
`(S (NP a b) c)` or Penn style `(S (NP (DT the) (NN cat)) (VP (VBD sat)))`; blank lines are skipped, and each
tree is a document of its own (data.eval_fraction of them are held out for eval). As the authors' preprocessing does (github.com/nxphi47/tree_transformer
src/dptree/nstack_process.py: part-of-speech tags kept apart from the nodes, `remove_single_nodeset`), a node over a
single word (a part-of-speech tag) is no node, and a chain of single-child nodes keeps its lowest: every node has
two children or more, so no two nodes share a span.

A tree's row: [CLS], its leaves' word pieces (each leaf tokenized alone with the run's tokenizer, so all pieces of a
leaf belong to it), [SEP], then its nodes in bottom-up order (reverse breadth-first, the code's), each node's token
the first word piece of its label. `node_first` / `node_last` hold a node's span as the row positions of its first
and last leaf piece, -1 at every other position. `single` rows hold one tree; `packed` rows several, each its own
attention group with positions restarting. A tree longer than a row is left out and counted (`long_trees`).
"""

import dataclasses
import os
import re

import numpy as np

from bertjax.core.errors import UserError
from bertjax.data import instances, sources, units

FORMATS = ("single", "packed")
FIELDS = ("node_first", "node_last")
_TOKENS = re.compile(r"\(|\)|[^\s()]+")
_FIX = "write one bracketed tree a line, e.g. (S (NP a b) c)"


@dataclasses.dataclass(frozen=True)
class Parsed:
  """A tree after collapsing: its leaves (words) and nodes, bottom-up, as (label, first leaf, last leaf)."""

  leaves: tuple
  nodes: tuple


def parse(line: str, where: str = "") -> Parsed:
  """The tree of one bracketed line; UserError naming `where` (PATH:LINE) and the problem when it does not parse."""
  bad = lambda problem: UserError(f"{where or 'tree'}: the bracketed tree does not parse ({problem}); {_FIX}")
  tokens = _TOKENS.findall(line)
  if not tokens or tokens[0] != "(":
    raise bad("it does not start with '('")
  stack, root = [], None
  for i, t in enumerate(tokens):
    if root is not None:
      raise bad(f"text after the tree's closing ')': {' '.join(tokens[i:i + 3])!r}")
    if t == "(":
      if i + 1 >= len(tokens) or tokens[i + 1] in "()":
        raise bad("a '(' without a label after it")
      stack.append([None, []])
    elif t == ")":
      if not stack:
        raise bad("a ')' without its '('")
      label, kids = stack.pop()
      if not kids:
        raise bad(f"node {label!r} has no children")
      node = (label, kids)
      if stack:
        stack[-1][1].append(node)
      else:
        root = node
    elif stack[-1][0] is None:
      stack[-1][0] = t
    else:
      stack[-1][1].append(t)
  if root is None:
    raise bad(f"{len(stack)} '(' left open")
  return _spans(_collapse(root))


def _collapse(t):
  """A word, or (label, children) with two children or more: single-child nodes give way to their child."""
  if isinstance(t, str):
    return t
  kids = [_collapse(k) for k in t[1]]
  return kids[0] if len(kids) == 1 else (t[0], kids)


def _spans(tree) -> Parsed:
  """Leaves in order and nodes bottom-up (reverse breadth-first) with their leaf spans."""
  leaves, first = [], {}

  def walk(t):  # leaf spans of every node, by object id
    if isinstance(t, str):
      leaves.append(t)
      return
    start = len(leaves)
    for k in t[1]:
      walk(k)
    first[id(t)] = (start, len(leaves) - 1)

  walk(tree)
  order, queue = [], [tree] if not isinstance(tree, str) else []
  while queue:
    t = queue.pop(0)
    order.append((t[0], *first[id(t)]))
    queue += [k for k in t[1] if not isinstance(k, str)]
  return Parsed(tuple(leaves), tuple(reversed(order)))


def text(parsed: Parsed) -> str:
  """The sentence a tree holds (its leaves, space-separated): what a tokenizer trained on the corpus reads."""
  return " ".join(parsed.leaves)


def encode(tok, parsed: Parsed) -> tuple:
  """(ids, word_start, leaf pieces, spans [nodes, 2]): the leaves' word pieces then the nodes' label pieces; spans
  index the leaf pieces (inclusive)."""
  ids, starts, bounds = [], [], []
  for word in parsed.leaves:
    piece_ids, ws = tok.encode(word)
    piece_ids = list(piece_ids) or [tok.special.unk]  # a leaf always keeps a position of its own
    bounds.append((len(ids), len(ids) + len(piece_ids) - 1))
    ids += piece_ids
    starts += [True] + [False] * (len(piece_ids) - 1)
  n = len(ids)
  for label, *_ in parsed.nodes:
    label_ids = list(tok.encode(label)[0])
    ids.append(label_ids[0] if label_ids else tok.special.unk)
    starts.append(True)
  spans = np.array([(bounds[a][0], bounds[b][1]) for _, a, b in parsed.nodes], np.int32).reshape(-1, 2)
  return np.asarray(ids, np.int32), np.asarray(starts, bool), n, spans


def rows(examples, seq_len: int, special, packed: bool, stats: instances.InstanceStats) -> dict | None:
  """Rows of encoded trees (`encode`'s tuples): one a row, or with `packed` several (instances.packed_rows: first
  fit); trees longer than seq_len - 2 are left out and counted in stats.long_trees. None when no row is made."""
  kept = []
  for e in examples:
    if len(e[0]) + 2 > seq_len:
      stats.long_trees += 1
    else:
      kept.append(e)
  groups_of_rows = instances.packed_rows(kept, seq_len, stats) if packed else ([e] for e in kept)
  out = {k: [] for k in ("input_ids", "word_start", "groups", "position_ids", *FIELDS)}
  for row in groups_of_rows:
    arrays = {k: np.full(seq_len, fill, dtype) for k, fill, dtype in (
        ("input_ids", special.pad, np.int32), ("word_start", False, bool), ("groups", 0, np.int32),
        ("position_ids", 0, np.int32), ("node_first", -1, np.int32), ("node_last", -1, np.int32))}
    at = 0
    for group, (ids, starts, n, spans) in enumerate(row, start=1):
      at = _place(arrays, at, group, ids, starts, n, spans, special)
    for k in out:
      out[k].append(arrays[k])
    stats.instances += 0 if packed else 1
    stats.examples += 0 if packed else 1
  if not out["input_ids"]:
    return None
  arrays = {k: np.stack(v) for k, v in out.items()}
  if not packed:
    del arrays["position_ids"]
  n = len(arrays["input_ids"])
  arrays.update(type_ids=np.zeros_like(arrays["input_ids"]), sentence_label=np.zeros(n, np.int32))
  stats.tokens += int((arrays["groups"] > 0).sum())
  return arrays


def _place(arrays, at, group, ids, starts, n, spans, special) -> int:
  """Writes [CLS] leaves [SEP] nodes of one tree at column `at` of a row; returns the column after it."""
  length = len(ids) + 2
  row_ids = np.concatenate([[special.cls], ids[:n], [special.sep], ids[n:]])
  arrays["input_ids"][at:at + length] = row_ids
  arrays["word_start"][at:at + length] = np.concatenate([[True], starts[:n], [True], starts[n:]])
  arrays["groups"][at:at + length] = group
  arrays["position_ids"][at:at + length] = np.arange(length)
  nodes = at + n + 2 + np.arange(len(spans))
  arrays["node_first"][nodes], arrays["node_last"][nodes] = at + 1 + spans[:, 0], at + 1 + spans[:, 1]
  return at + length


def chunk_rows(tok, docs: list, fmt: str, seq_len: int, train: bool) -> tuple:
  """(arrays or None, stats, trees, leaf pieces, token counts) of a chunk of documents of parsed trees (each line
  (text, Parsed), as `open_reader` reads them): data preparation's rows for data.trees."""
  stats = instances.InstanceStats()
  encoded = [encode(tok, parsed) for lines in docs for _, parsed in lines]
  counts = np.zeros(tok.vocab_size, np.int64)
  if train and encoded:  # the unigram counts are the leaves' (the nodes' labels are no text)
    counts += np.bincount(np.concatenate([e[0][:e[2]] for e in encoded]), minlength=tok.vocab_size)[:tok.vocab_size]
  arrays = rows(encoded, seq_len, tok.special, fmt == "packed", stats)
  return arrays, stats, len(encoded), sum(e[2] for e in encoded), counts


def _documents(files: list, stats: sources.SourceStats):
  """Every tree its own document of one (text, Parsed) line, parsed as it is read: PATH:LINE in any error."""
  for path in files:
    with open(path, encoding="utf-8") as f:
      for number, line in enumerate(f, start=1):
        stats.progress += len(line.encode("utf-8"))
        if line.strip():
          parsed = parse(line, f"{path}:{number}")
          stats.documents += 1
          yield [(text(parsed), parsed)]


def open_reader(config):
  """The Reader of config.data.source: with data.trees, its files' trees (UserError for a source other than
  text:GLOB, or a format other than single and packed); else units.open_reader's."""
  d = config.data
  if not d.get("trees", False):
    return units.open_reader(config)
  kind, _, pattern = d.source.partition(":")
  if kind != "text" or not pattern:
    raise UserError(f"data.trees=True reads bracketed trees from text files; set --config.data.source=text:GLOB "
                    f"(not {d.source!r})")
  if d.format not in ("auto",) + FORMATS:
    raise UserError(f"data.format={d.format!r} cannot hold trees; use single (one tree a row) or packed")
  files = [os.path.expanduser(p) for p in sources.text_files(pattern)]
  return sources.Reader(d.source, False, sum(os.path.getsize(p) for p in files), "bytes",
                        lambda stats: _documents(files, stats))


def encode_rows(texts: list, tok, seq_len: int, what: str = "row") -> dict:
  """A classification task's trees (one bracketed tree per text) as fixed-length rows, one a row: input_ids,
  type_ids, groups, node_first, node_last. UserError naming the row for a tree that does not parse or does not fit."""
  out = []
  for i, t in enumerate(texts):
    e = encode(tok, parse(t, f"{what} {i + 1}"))
    if len(e[0]) + 2 > seq_len:
      raise UserError(f"{what} {i + 1}: its tree needs {len(e[0]) + 2} positions (leaf pieces, nodes, [CLS], [SEP]) "
                      f"but seq_len={seq_len}; raise --config.seq_len")
    out.append(e)
  arrays = rows(out, seq_len, tok.special, False, instances.InstanceStats())
  return {k: arrays[k] for k in ("input_ids", "type_ids", "groups", *FIELDS)}
