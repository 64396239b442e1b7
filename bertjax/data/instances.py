"""Training instances from tokenized documents: NSP pairs, SOP pairs, single segments; fixed-length rows.

A tokenized document is a list of sentences, each a pair of arrays (ids, word_start). Pair creation
follows google-research/bert's `create_instances_from_document` (target length with `short_seq_prob`,
chunks of whole sentences, truncation of the longer segment at a random end) with two deliberate
differences: NSP's random B segment always comes from *another* document, and SOP never falls back to
a random-document pair (ALBERT's code did): a chunk that cannot give two segments is skipped and counted.
"""

import dataclasses
import random

import numpy as np

from bertjax.data.tokenizer import SpecialIds

FORMATS = ("nsp", "sop", "single")


@dataclasses.dataclass
class InstanceStats:
  instances: int = 0
  positive: int = 0  # label 1: random-next (NSP) or swapped (SOP)
  too_short_documents: int = 0  # fewer than two sentences: cannot give a pair (SOP)
  unpaired_chunks: int = 0  # chunks of one sentence, skipped by SOP

  @property
  def label_balance(self) -> float:
    return self.positive / max(self.instances, 1)


def _concat(segments):
  if not segments:
    return np.zeros(0, np.int32), np.zeros(0, bool)
  return np.concatenate([s[0] for s in segments]), np.concatenate([s[1] for s in segments])


def _truncate_pair(a, b, max_tokens, rng):
  """Drops tokens from the longer segment, at its front or back at random, until the pair fits."""
  a, b = list(a), list(b)  # [ids, ws] each
  while len(a[0]) + len(b[0]) > max_tokens:
    seg = a if len(a[0]) > len(b[0]) else b
    cut = slice(1, None) if rng.random() < 0.5 else slice(None, -1)
    seg[0], seg[1] = seg[0][cut], seg[1][cut]
  return a, b


def _target_length(max_tokens, short_seq_prob, rng):
  return rng.randint(2, max_tokens) if rng.random() < short_seq_prob else max_tokens


def pair_instances(docs, doc_index, fmt, max_tokens, short_seq_prob, rng, stats):
  """Yields (a, b, label) pairs from docs[doc_index]; a and b are (ids, word_start)."""
  doc = docs[doc_index]
  if fmt == "sop" and len(doc) < 2:
    stats.too_short_documents += 1
    return
  target = _target_length(max_tokens, short_seq_prob, rng)
  chunk, length, i = [], 0, 0
  while i < len(doc):
    chunk.append(doc[i])
    length += len(doc[i][0])
    if i == len(doc) - 1 or length >= target:
      a_end = rng.randint(1, len(chunk) - 1) if len(chunk) >= 2 else 1
      a = _concat(chunk[:a_end])
      label = 0
      if fmt == "sop":
        if len(chunk) < 2:
          stats.unpaired_chunks += 1
          chunk, length, i = [], 0, i + 1
          continue
        b = _concat(chunk[a_end:])
        if rng.random() < 0.5:
          a, b, label = b, a, 1
      elif len(chunk) == 1 or rng.random() < 0.5:
        label = 1
        other = rng.randrange(len(docs) - 1)
        other = other + 1 if other >= doc_index else other  # never the same document
        rdoc, start = docs[other], rng.randrange(len(docs[other]))
        segs, need = [], target - len(a[0])
        for s in rdoc[start:]:
          segs.append(s)
          if sum(len(x[0]) for x in segs) >= need:
            break
        b = _concat(segs)
        i -= len(chunk) - a_end  # the unused sentences go back for the next chunk
      else:
        b = _concat(chunk[a_end:])
      a, b = _truncate_pair(a, b, max_tokens, rng)
      if len(a[0]) and len(b[0]):
        stats.instances += 1
        stats.positive += label
        yield a, b, label
      chunk, length = [], 0
    i += 1


def single_instances(docs, doc_index, max_tokens, rng, stats):
  """Yields runs of whole sentences of one document, up to max_tokens (no sentence objective)."""
  chunk, length = [], 0
  target = max_tokens
  for s in docs[doc_index]:
    chunk.append((s[0][:max_tokens], s[1][:max_tokens]))
    length += len(chunk[-1][0])
    if length >= target:
      ids, ws = _concat(chunk)
      stats.instances += 1
      yield (ids[:max_tokens], ws[:max_tokens]), None, 0
      chunk, length = [], 0
  if chunk:
    stats.instances += 1
    ids, ws = _concat(chunk)
    yield (ids, ws), None, 0


def to_row(a, b, label, seq_len, special: SpecialIds):
  """[CLS] A [SEP] (B [SEP]) as fixed-length arrays padded with [PAD] (types 0 for A, 1 for B)."""
  ids = [special.cls, *a[0], special.sep]
  ws = [True, *a[1], True]
  types = [0] * len(ids)
  if b is not None:
    ids += [*b[0], special.sep]
    ws += [*b[1], True]
    types += [1] * (len(b[0]) + 1)
  n = len(ids)
  pad = seq_len - n
  return dict(
      input_ids=np.asarray(ids + [special.pad] * pad, np.int32),
      type_ids=np.asarray(types + [0] * pad, np.int32),
      word_start=np.asarray(ws + [False] * pad, bool),
      groups=np.asarray([1] * n + [0] * pad, np.int32),
      sentence_label=np.int32(label),
  )


def make_instances(docs, fmt, seq_len, special, *, short_seq_prob=0.1, dupe_factor=1, seed=0):
  """All instances of `docs` as stacked arrays, `dupe_factor` passes with different pairings."""
  if fmt not in FORMATS:
    raise ValueError(f"unknown instance format {fmt!r}")
  stats = InstanceStats()
  rows = []
  for dupe in range(dupe_factor):
    rng = random.Random(seed * 1000003 + dupe)
    for d in range(len(docs)):
      if fmt == "single":
        gen = single_instances(docs, d, seq_len - 2, rng, stats)
      else:
        gen = pair_instances(docs, d, fmt, seq_len - 3, short_seq_prob, rng, stats)
      rows.extend(to_row(a, b, label, seq_len, special) for a, b, label in gen)
    if dupe == 0:
      first_pass = dataclasses.replace(stats)
  if not rows:
    return None, stats
  arrays = {k: np.stack([r[k] for r in rows]) for k in rows[0]}
  # Documents are counted once, not once per pass.
  stats.too_short_documents, stats.unpaired_chunks = first_pass.too_short_documents, first_pass.unpaired_chunks
  return arrays, stats
