"""Training instances from tokenized documents: NSP/SOP pairs, ELECTRA's examples, single segments, packed rows.

A tokenized document is a list of sentences, each a tuple of arrays (ids, word_start), or with entity/phrase
spans (bertjax.data.units) (ids, word_start, unit_start, mention); every row-making rule below carries all of
them alike. Pair creation
follows google-research/bert's `create_instances_from_document` (target length with `short_seq_prob`,
chunks of whole sentences, truncation of the longer segment at a random end) with two deliberate
differences: NSP's random B segment always comes from *another* document, and SOP never falls back to
a random-document pair (ALBERT's code did): a chunk that cannot give two segments is skipped and counted.
StructBERT's SSO pairs draw one of three labels with probability 1/3 each: 0 = B is the segment after A,
1 = B is the segment before A (the two swapped, as SOP swaps them), 2 = B from another document (made as
NSP makes its random B); a chunk of one sentence is skipped and counted (as for SOP), so the three stay
balanced.

Two formats without a sentence objective pack more text into each row:
- `full_sentences` (RoBERTa's FULL-SENTENCES): contiguous whole sentences, crossing document boundaries,
  up to seq_len, with an extra [SEP] where one document ends and the next begins; one attention group.
- `packed`: blocks of whole sentences of one document (as `single` makes them), several to a row, each
  with its own group id (attention stays inside it) and positions restarting at 0 (`position_ids`).

`single` (SpanBERT, and MLM-only runs) writes blocks of whole sentences of one document, the sentence that
would overflow a block starting the next (SpanBERT's BlockDataset; `single_instances`), one pass only.

`electra` follows google-research/electra's `build_pretraining_dataset.py` (`ExampleBuilder`), so that the
segment-1 embedding is trained as in the published models though there is no sentence objective: the
sentences of a document accumulate until they reach the target length (seq_len, or with probability
`short_seq_prob`, 0.05 in ELECTRA's code, a length drawn from [5, seq_len] for the next example); the
example is one segment with probability 0.1, else sentences go to segment A while it stays under half
the target ((target - 3) // 2; the sentence that would cross it with probability 1/2, while B is empty)
and the others to B (a short sentence after B began can still join A: ELECTRA's rule, kept); A is cut
to seq_len - 2 tokens, B to what is left after A's and the three special tokens, and a B cut to nothing
leaves a one-segment example. The target length carries over from one document to the next, as in
ELECTRA's stream. Deliberate differences: the draws come from the pass's seeded rng (no global
`random`), data.dupe_factor passes are possible (ELECTRA's code makes one; configs/electra.py sets 1),
and the eval split gets no short targets (short_seq_prob 0, as for the BERT formats).
"""

import dataclasses
import random

import numpy as np

from bertjax.data.tokenizer import SpecialIds
from bertjax.data.units import whole_mentions

FORMATS = ("nsp", "sop", "sso", "electra", "single", "full_sentences", "packed", "stream")  # stream: bertjax.data.plm
PAIR_FORMATS = ("nsp", "sop", "sso")
_PACKING_BINS = 8  # open rows the `packed` format fills first-fit before the oldest is written out
# google-research/electra build_pretraining_dataset.py, ExampleBuilder._create_example:
ELECTRA_ONE_SEGMENT_PROB = 0.1  # "small chance to only have one segment as in classification tasks"
ELECTRA_MIN_TARGET = 5  # a short target is random.randint(5, max_length)


@dataclasses.dataclass
class InstanceStats:
  instances: int = 0
  positive: int = 0  # label 1: random-next (NSP), swapped (SOP), previous (SSO)
  other_document: int = 0  # SSO label 2: B from another document
  too_short_documents: int = 0  # fewer than two sentences: cannot give a pair (SOP, SSO)
  unpaired_chunks: int = 0  # chunks of one sentence, skipped by SOP and SSO
  examples: int = 0  # examples inside the rows (more than `instances` for the packed format)
  tokens: int = 0  # real (non-padding) tokens in the rows, special tokens included
  one_segment: int = 0  # electra: examples without a B segment (drawn so, or nothing left for B)
  one_segment_drawn: int = 0  # electra: of those, the ones the 10% draw made single
  short_targets: int = 0  # electra: examples accumulated to a random shorter target length
  spans: int = 0  # entity/phrase spans marked on tokens (bertjax.data.units), counted per sentence
  unaligned_spans: int = 0  # spans dropped: no token of their own
  replaced_mentions: int = 0  # WKLM: mentions replaced by another of their type
  long_trees: int = 0  # bracketed trees (bertjax.data.trees) longer than a row, left out

  @property
  def label_balance(self) -> float:
    return self.positive / max(self.instances, 1)


def describe_electra(stats: InstanceStats) -> str:
  """The shares that show the electra format at work: one-segment examples (10% drawn, plus those with
  nothing left for B) and examples of a short target (short_seq_prob)."""
  n = max(stats.instances, 1)
  return (f"one-segment share {stats.one_segment / n:.3f} ({stats.one_segment_drawn / n:.3f} drawn), "
          f"short-target share {stats.short_targets / n:.3f}")


def _concat(segments):
  if not segments:
    return np.zeros(0, np.int32), np.zeros(0, bool)
  return tuple(np.concatenate([s[k] for s in segments]) for k in range(len(segments[0])))


def _truncate_pair(a, b, max_tokens, rng):
  """Drops tokens from the longer segment, at its front or back at random, until the pair fits.

  BERT's loop, one random draw per dropped token, run on lengths and counts: the arrays are sliced once.
  """
  length, front = [len(a[0]), len(b[0])], [0, 0]
  while length[0] + length[1] > max_tokens:
    i = 0 if length[0] > length[1] else 1
    length[i] -= 1
    front[i] += rng.random() < 0.5
  return [tuple(field[f:f + n] for field in x) for x, f, n in zip((a, b), front, length)]


def _target_length(max_tokens, short_seq_prob, rng):
  return rng.randint(2, max_tokens) if rng.random() < short_seq_prob else max_tokens


def _random_segment(docs, doc_index, need, rng):
  """BERT's random B: sentences of another document (never docs[doc_index]) from a random one on, until
  they hold `need` tokens."""
  other = rng.randrange(len(docs) - 1)
  other = other + 1 if other >= doc_index else other  # never the same document
  rdoc, start = docs[other], rng.randrange(len(docs[other]))
  segs = []
  for s in rdoc[start:]:
    segs.append(s)
    if sum(len(x[0]) for x in segs) >= need:
      break
  return _concat(segs)


def pair_instances(docs, doc_index, fmt, max_tokens, short_seq_prob, rng, stats):
  """Yields (a, b, label) pairs from docs[doc_index]; a and b are (ids, word_start)."""
  doc = docs[doc_index]
  if fmt in ("sop", "sso") and len(doc) < 2:
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
      if fmt in ("sop", "sso") and len(chunk) < 2:
        stats.unpaired_chunks += 1
        chunk, length, i = [], 0, i + 1
        continue
      if fmt == "sop":
        b = _concat(chunk[a_end:])
        if rng.random() < 0.5:
          a, b, label = b, a, 1
      elif fmt == "sso":
        label = rng.randrange(3)
        if label == 2:
          b = _random_segment(docs, doc_index, target - len(a[0]), rng)
          i -= len(chunk) - a_end  # the unused sentences go back for the next chunk
        else:
          b = _concat(chunk[a_end:])
          if label == 1:  # B precedes A
            a, b = b, a
      elif len(chunk) == 1 or rng.random() < 0.5:
        label = 1
        b = _random_segment(docs, doc_index, target - len(a[0]), rng)
        i -= len(chunk) - a_end  # the unused sentences go back for the next chunk
      else:
        b = _concat(chunk[a_end:])
      a, b = _truncate_pair(a, b, max_tokens, rng)
      if len(a[0]) and len(b[0]):
        stats.instances += 1
        stats.positive += label == 1
        stats.other_document += label == 2
        yield a, b, label
      chunk, length = [], 0
    i += 1


def single_instances(docs, doc_index, max_tokens, stats):
  """Yields blocks of whole sentences of one document, up to max_tokens each (no sentence objective), as
  SpanBERT makes them (facebookresearch/SpanBERT pretraining/fairseq/data/no_nsp_span_bert_dataset.py,
  BlockDataset, break_mode "doc"): sentences join the block while they fit; the sentence that would overflow
  it ends the block and starts the next, and the document's last sentence ends its last block, so every token
  of the document is in exactly one block. One deliberate difference: a sentence longer than max_tokens is cut
  into max_tokens-sized pieces, each its own block (SpanBERT skips such a sentence, and the block before it when
  it ends a document)."""
  chunk, length = [], 0
  for piece, _ in _pieces([docs[doc_index]], max_tokens):
    if chunk and length + len(piece[0]) > max_tokens:
      stats.instances += 1
      yield _concat(chunk), None, 0
      chunk, length = [], 0
    chunk.append(piece)
    length += len(piece[0])
  if chunk:
    stats.instances += 1
    yield _concat(chunk), None, 0


def _electra_segments(sentences, target, max_tokens, rng):
  """ELECTRA's (A, B, drawn_single) from one example's sentences; see the module docstring for the rule.

  B is None when it is empty. The draws happen in ELECTRA's order (one-segment draw, then one coin per
  sentence that would take A over its half), so the same seed gives its choices for the same stream.
  """
  drawn_single = rng.random() < ELECTRA_ONE_SEGMENT_PROB
  half = float("inf") if drawn_single else (target - 3) // 2
  a, b, n_a, n_b = [], [], 0, 0
  for s in sentences:
    n = len(s[0])
    if not n_a or n_a + n < half or (not n_b and n_a < half and rng.random() < 0.5):
      a.append(s)
      n_a += n
    else:
      b.append(s)
      n_b += n
  a = [x[:max_tokens - 2] for x in _concat(a)]
  b = [x[:max(0, max_tokens - len(a[0]) - 3)] for x in _concat(b)]
  return tuple(a), (tuple(b) if len(b[0]) else None), drawn_single


def electra_instances(docs, max_tokens, short_seq_prob, rng, stats):
  """Yields (a, b or None, 0) examples of all `docs` in order, ELECTRA's way (module docstring).

  One generator for the whole pass, not one per document: the target length drawn after a document's
  last example is the next document's first, as in ELECTRA's stream of lines. max_tokens is seq_len.
  """
  target, short = max_tokens, False
  for doc in docs:
    chunk, length = [], 0
    for i, s in enumerate(doc):
      chunk.append(s)
      length += len(s[0])
      if length >= target or i == len(doc) - 1:
        a, b, drawn_single = _electra_segments(chunk, target, max_tokens, rng)
        stats.instances += 1
        stats.one_segment += b is None
        stats.one_segment_drawn += drawn_single
        stats.short_targets += short
        yield a, b, 0
        short = rng.random() < short_seq_prob
        target = rng.randint(ELECTRA_MIN_TARGET, max_tokens) if short else max_tokens
        chunk, length = [], 0


class _RowBuffer:
  """Fixed-length rows written in place into arrays that grow by doubling (no per-row allocation)."""

  def __init__(self, seq_len, special: SpecialIds, positions: bool, units: bool = False):
    self.seq_len, self.special, self.n = seq_len, special, 0
    self.fields = dict(input_ids=(np.int32, special.pad), type_ids=(np.int32, 0), word_start=(bool, False),
                       groups=(np.int32, 0), **(dict(position_ids=(np.int32, 0)) if positions else {}),
                       **(dict(unit_start=(bool, False), mention=(np.uint8, 0)) if units else {}))
    self.units = units
    self.arrays = {k: np.full((64, seq_len), fill, dtype) for k, (dtype, fill) in self.fields.items()}
    self.labels = np.zeros(64, np.int32)

  def _next(self) -> int:
    if self.n == len(self.labels):
      for k, (dtype, fill) in self.fields.items():
        grown = np.full((2 * self.n, self.seq_len), fill, dtype)
        grown[:self.n] = self.arrays[k]
        self.arrays[k] = grown
      self.labels = np.concatenate([self.labels, np.zeros(self.n, np.int32)])
    self.n += 1
    return self.n - 1

  def _segment(self, i, at, seg, segment=0, group=1, position=None):
    """[CLS]-less segment (ids, word_start[, unit_start, mention]) + [SEP] at row i from column `at`; returns
    the column after it."""
    ids, ws = seg[0], seg[1]
    n = len(ids)
    self.arrays["input_ids"][i, at:at + n], self.arrays["input_ids"][i, at + n] = ids, self.special.sep
    self.arrays["word_start"][i, at:at + n], self.arrays["word_start"][i, at + n] = ws, True
    if self.units:  # [SEP] is a unit of its own and no mention; a mention cut by truncation is none either
      self.arrays["unit_start"][i, at:at + n], self.arrays["unit_start"][i, at + n] = seg[2], True
      self.arrays["mention"][i, at:at + n] = whole_mentions(seg[3])
    self.arrays["type_ids"][i, at:at + n + 1] = segment
    self.arrays["groups"][i, at:at + n + 1] = group
    if position is not None:
      self.arrays["position_ids"][i, at:at + n + 1] = np.arange(position, position + n + 1)
    return at + n + 1

  def _cls(self, i, at, group=1):
    self.arrays["input_ids"][i, at], self.arrays["word_start"][i, at] = self.special.cls, True
    if self.units:
      self.arrays["unit_start"][i, at] = True
    self.arrays["groups"][i, at] = group
    return at + 1

  def add_pair(self, a, b, label):
    """[CLS] A [SEP] (B [SEP]): types 0 for A, 1 for B."""
    i = self._next()
    at = self._segment(i, self._cls(i, 0), a)
    if b is not None:
      self._segment(i, at, b, segment=1)
    self.labels[i] = label

  def add_packed(self, examples):
    """Examples [CLS] x [SEP] side by side: group ids 1, 2, ... and positions restarting at 0 in each."""
    i, at = self._next(), 0
    for group, example in enumerate(examples, start=1):
      at = self._segment(i, self._cls(i, at, group), example, group=group, position=1)

  def result(self) -> dict:
    out = {k: v[:self.n] for k, v in self.arrays.items()}
    out["sentence_label"] = self.labels[:self.n]
    return out


def _pieces(docs, budget):
  """(sentence, starts_document) of every sentence in order, sentences longer than `budget` cut into
  budget-sized pieces so that no text is lost."""
  for doc in docs:
    first = True
    for sentence in doc:
      for start in range(0, len(sentence[0]), budget):
        yield tuple(field[start:start + budget] for field in sentence), first
        first = False


def full_sentence_rows(docs, seq_len, special: SpecialIds, stats):
  """Yields the content of RoBERTa FULL-SENTENCES rows, (ids, word_start) to go between [CLS] and the last
  [SEP]: whole sentences in corpus order crossing documents, an extra [SEP] where a document begins
  inside a row (never at a row's start)."""
  budget = seq_len - 2  # [CLS] and the closing [SEP]
  content, used = [], 0
  separator_piece = None
  for piece, starts_document in _pieces(docs, budget):
    ids = piece[0]
    # [SEP]: a word and a unit of its own, no mention
    separator_piece = separator_piece or (np.array([special.sep], np.int32), np.ones(1, bool),
                                          np.ones(1, bool), np.zeros(1, np.uint8))[:len(piece)]
    separator = starts_document and used > 0
    if used + len(ids) + separator > budget:
      stats.instances += 1
      yield _concat(content)
      content, used, separator = [], 0, False
    if separator:
      content.append(separator_piece)
    content.append(piece)
    used += len(ids) + separator
  if used:
    stats.instances += 1
    yield _concat(content)


def packed_rows(examples, seq_len, stats):
  """Yields lists of (ids, word_start) examples (each at most seq_len - 2 tokens) that fill one row
  each with their [CLS] and [SEP]: first-fit over a few open rows, the oldest written out when none has
  room, so short documents stop costing a row each."""
  bins = []  # [examples, tokens used]
  for example in examples:
    n = len(example[0]) + 2
    target = next((b for b in bins if b[1] + n <= seq_len), None)
    if target is None:
      if len(bins) == _PACKING_BINS:
        stats.instances += 1
        yield bins.pop(0)[0]
      target = [[], 0]
      bins.append(target)
    target[0].append(example)
    target[1] += n
    stats.examples += 1
  for examples_of_row, _ in bins:
    stats.instances += 1
    yield examples_of_row


def _write_pass(rows: _RowBuffer, docs, fmt, seq_len, short_seq_prob, rng, stats):
  """Writes the rows of one pass over `docs` into `rows`."""
  if fmt == "full_sentences":
    for content in full_sentence_rows(docs, seq_len, rows.special, stats):
      stats.examples += 1
      rows.add_pair(content, None, 0)
  elif fmt == "packed":
    single = InstanceStats()  # its instances are the examples, counted by packed_rows
    examples = (a for d in range(len(docs)) for a, _, _ in single_instances(docs, d, seq_len - 2, single))
    for examples_of_row in packed_rows(examples, seq_len, stats):
      rows.add_packed(examples_of_row)
  elif fmt == "electra":
    for a, b, label in electra_instances(docs, seq_len, short_seq_prob, rng, stats):
      stats.examples += 1
      rows.add_pair(a, b, label)
  else:
    for d in range(len(docs)):
      if fmt == "single":
        gen = single_instances(docs, d, seq_len - 2, stats)
      else:
        gen = pair_instances(docs, d, fmt, seq_len - 3, short_seq_prob, rng, stats)
      for a, b, label in gen:
        stats.examples += 1
        rows.add_pair(a, b, label)


def make_instances(docs, fmt, seq_len, special, *, short_seq_prob=0.1, dupe_factor=1, seed=0, units=False):
  """All instances of `docs` as stacked arrays, `dupe_factor` passes with different pairings.

  Returns (arrays, stats): input_ids, type_ids, word_start, groups [N, seq_len] (plus position_ids for
  the packed format, unit_start and mention with `units`: the sentences carry them) and sentence_label [N];
  arrays is None when there are no instances. single,
  full_sentences and packed rows involve no random choice, so they get one pass whatever dupe_factor says
  (more passes would only write identical copies; masking is dynamic: every epoch masks them anew). NSP and SSO
  need two documents at least: with fewer, there are none.
  """
  if fmt not in FORMATS or fmt == "stream":  # the stream is made by bertjax.data.plm.token_stream
    raise ValueError(f"unknown instance format {fmt!r}")
  stats = InstanceStats()
  if fmt in ("nsp", "sso") and len(docs) < 2:
    return None, stats
  rows = _RowBuffer(seq_len, special, positions=fmt == "packed", units=units)
  for dupe in range(dupe_factor if fmt in ("nsp", "sop", "sso", "electra") else 1):
    rng = random.Random(seed * 1000003 + dupe)
    _write_pass(rows, docs, fmt, seq_len, short_seq_prob, rng, stats)
    if dupe == 0:
      first_pass = dataclasses.replace(stats)
  if not rows.n:
    return None, stats
  arrays = rows.result()
  stats.tokens = int((arrays["groups"] > 0).sum())
  # Documents are counted once, not once per pass.
  stats.too_short_documents, stats.unpaired_chunks = first_pass.too_short_documents, first_pass.unpaired_chunks
  return arrays, stats


def validate(config):
  """Checks config.data (eval share, instance format, tokenizer model); raises UserError with the fix on the
  first problem."""
  from bertjax.core.config import check  # imports JAX: the data workers import this module without it

  d = config.data
  check(0 < d.eval_fraction < 1, f"data.eval_fraction={d.eval_fraction} must be in (0, 1)")
  check(d.format in ("auto",) + FORMATS,
        f"data.format={d.format!r}; use auto, electra, single, full_sentences or packed (nsp, sop and plm's stream "
        "follow the objectives)")
  check(config.model.type_vocab_size >= 2 or d.format != "electra",
        "data.format=electra makes segment-B tokens (type id 1); set --config.model.type_vocab_size=2")
  check(d.tokenizer_model in ("unigram", "bpe"), f"data.tokenizer_model={d.tokenizer_model!r}; use unigram or bpe")
  if config.objectives.get("plm", 0) or d.format == "stream":
    from bertjax.data import plm  # the stream format's windows: reuse part, permutation blocks, targets

    plm.validate(config)
  if d.get("units", "") or d.source == "units":
    from bertjax.data import units  # span files are checked (they exist) before anything is prepared

    units.units_mode(config)
    units.parse_spec(d.units)
