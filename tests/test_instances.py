"""NSP/SOP instances: label balance, where segments come from, never NSP for SOP, counts of short documents;
ELECTRA's examples: the split rule, and its statistics on a real corpus."""

import numpy as np
import pytest

from bertjax.data import instances, sources
from bertjax.data.tokenizer import SpecialIds, train_sentencepiece

SPECIAL = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)
DOC_SPAN = 10_000  # document d's tokens are d*DOC_SPAN + position: the origin of every token is known


def _docs(n_docs=60, seed=0, min_sents=2, max_sents=12):
  rng = np.random.default_rng(seed)
  docs = []
  for d in range(n_docs):
    sents, pos = [], 0
    for _ in range(rng.integers(min_sents, max_sents + 1)):
      n = int(rng.integers(5, 30))
      sents.append((np.arange(pos, pos + n, dtype=np.int32) + d * DOC_SPAN + 100, np.ones(n, bool)))
      pos += n
    docs.append(sents)
  return docs


def _segments(row):
  ids, types = row["input_ids"], row["type_ids"]
  real = ids != SPECIAL.pad
  body = real & ~np.isin(ids, [SPECIAL.cls, SPECIAL.sep])
  return ids[body & (types == 0)], ids[body & (types == 1)]


def _rows(arrays):
  return [{k: v[i] for k, v in arrays.items()} for i in range(len(arrays["input_ids"]))]


def test_nsp_balance_and_random_segment_from_another_document():
  # BERT's semantics: half the pairs random, plus every one-sentence chunk (so short documents skew
  # the share upwards; start-up reports it). Documents of realistic length stay near one half.
  docs = _docs(min_sents=8, max_sents=30)
  arrays, stats = instances.make_instances(docs, "nsp", 128, SPECIAL, dupe_factor=3, seed=1)
  labels = arrays["sentence_label"]
  assert 0.4 < labels.mean() < 0.6, labels.mean()
  assert stats.instances == len(labels) and np.isclose(stats.label_balance, labels.mean())
  for row in _rows(arrays):
    a, b = _segments(row)
    doc_a, doc_b = set((a - 100) // DOC_SPAN), set((b - 100) // DOC_SPAN)
    assert len(doc_a) == 1 and len(doc_b) == 1
    if row["sentence_label"] == 1:
      assert doc_a != doc_b, "NSP's random segment came from the same document"
    else:
      assert doc_a == doc_b and b.min() > a.max(), "a 'next' pair is not in order within one document"


def test_sop_pairs_are_consecutive_segments_of_one_document_never_nsp():
  docs = _docs() + [[(np.arange(5, dtype=np.int32) + 99 * DOC_SPAN + 100, np.ones(5, bool))]]  # one-sentence doc
  arrays, stats = instances.make_instances(docs, "sop", 128, SPECIAL, dupe_factor=3, seed=1)
  labels = arrays["sentence_label"]
  assert 0.45 < labels.mean() < 0.55, labels.mean()
  assert stats.too_short_documents == 1
  for row in _rows(arrays):
    a, b = _segments(row)
    assert len(set((np.concatenate([a, b]) - 100) // DOC_SPAN)) == 1, "SOP pair spans two documents"
    first, second = (a, b) if row["sentence_label"] == 0 else (b, a)
    assert second.min() > first.max(), "SOP label does not match the order of the segments"


def test_sso_three_labels_are_balanced_and_correct_by_provenance():
  """StructBERT's SSO: 0 = B follows A, 1 = B precedes A (both of one document), 2 = B from another
  document; 1/3 each, one-sentence documents counted and skipped."""
  docs = _docs(n_docs=200, min_sents=4, max_sents=20) + [[(np.arange(5, dtype=np.int32) + 999 * DOC_SPAN + 100, np.ones(5, bool))]]
  arrays, stats = instances.make_instances(docs, "sso", 128, SPECIAL, dupe_factor=3, seed=1)
  labels = arrays["sentence_label"]
  shares = np.bincount(labels, minlength=3) / len(labels)
  assert len(labels) > 1000 and np.abs(shares - 1 / 3).max() < 0.05, shares  # 4 standard errors
  assert (stats.positive, stats.other_document) == ((labels == 1).sum(), (labels == 2).sum())
  assert stats.too_short_documents == 1
  for row in _rows(arrays):
    a, b = _segments(row)
    doc_a, doc_b = set((a - 100) // DOC_SPAN), set((b - 100) // DOC_SPAN)
    assert len(doc_a) == 1 and len(doc_b) == 1
    label = row["sentence_label"]
    if label == 2:
      assert doc_a != doc_b, "SSO's other-document segment came from the same document"
    else:
      assert doc_a == doc_b, "an SSO next/previous pair spans two documents"
      assert (b.min() > a.max()) if label == 0 else (b.max() < a.min()), f"label {label} disagrees with the order"


def test_sentence_objectives_pick_their_pairs():
  """Each sentence objective trains on the pairs of its name (SSO: next / previous / other document)."""
  from bertjax.core.errors import UserError
  from bertjax.data import prepare_lib
  from conftest import load_config

  assert prepare_lib.resolve_format(load_config("configs/structbert.py:tiny")) == "sso"
  assert prepare_lib.resolve_format(load_config("configs/spanbert.py:tiny")) == "single"
  both = load_config("configs/structbert.py:tiny")
  both.objectives.nsp = 1.0
  with pytest.raises(UserError, match="need different instances"):
    prepare_lib.resolve_format(both)


def test_rows_are_well_formed():
  arrays, _ = instances.make_instances(_docs(), "nsp", 64, SPECIAL, seed=0)
  for row in _rows(arrays)[:50]:
    ids = row["input_ids"]
    n = int(row["groups"].sum())
    assert ids[0] == SPECIAL.cls and ids[n - 1] == SPECIAL.sep and (ids[n:] == SPECIAL.pad).all()
    assert (ids == SPECIAL.sep).sum() == 2 and n <= 64
    sep = np.flatnonzero(ids == SPECIAL.sep)[0]
    assert (row["type_ids"][: sep + 1] == 0).all() and (row["type_ids"][sep + 1 : n] == 1).all()


def test_short_seq_prob_gives_shorter_targets():
  long_docs = _docs(min_sents=20, max_sents=30)
  full, _ = instances.make_instances(long_docs, "nsp", 128, SPECIAL, short_seq_prob=0.0, seed=0)
  short, _ = instances.make_instances(long_docs, "nsp", 128, SPECIAL, short_seq_prob=0.5, seed=0)
  assert short["groups"].sum(1).mean() < full["groups"].sum(1).mean() - 10


def test_single_segments_stay_in_one_document():
  arrays, stats = instances.make_instances(_docs(), "single", 64, SPECIAL, seed=0)
  assert (arrays["type_ids"] == 0).all()
  for row in _rows(arrays):
    a, b = _segments(row)
    assert len(b) == 0 and len(set((a - 100) // DOC_SPAN)) == 1


def _spanbert_blocks(sizes, max_num_tokens):
  """facebookresearch/SpanBERT pretraining/fairseq/data/no_nsp_span_bert_dataset.py, BlockDataset with
  break_mode "doc", on one document's sentence sizes: the (start, end) token offsets of its blocks."""
  doc, at = [], 0
  for sz in sizes:
    doc.append((at, at + sz))
    at += sz
  blocks, current_chunk, curr = [], [], 0
  while curr < len(doc):
    sent = doc[curr]
    if sent[1] - sent[0] <= max_num_tokens:
      current_chunk.append(sent)
      current_length = current_chunk[-1][1] - current_chunk[0][0]
      if curr == len(doc) - 1 or current_length > max_num_tokens:
        if current_length > max_num_tokens:
          current_chunk = current_chunk[:-1]
          curr -= 1
        if len(current_chunk) > 0:
          blocks.append((current_chunk[0][0], current_chunk[-1][1]))
        current_chunk = []
    curr += 1
  return blocks


def test_single_blocks_are_spanbert_s_end_on_sentence_boundaries_and_come_once():
  """SpanBERT's blocks token for token: the sentence that would overflow a block starts the next, so every
  token of the corpus is in one row, once, whatever dupe_factor says (the rows depend on no seed)."""
  docs = _docs(seed=2)
  arrays, stats = instances.make_instances(docs, "single", 64, SPECIAL, dupe_factor=5, seed=0)
  rows = [r[r != SPECIAL.pad][1:-1] for r in arrays["input_ids"]]
  expected = [np.concatenate([s[0] for s in d])[a:b] for d in docs
              for a, b in _spanbert_blocks([len(s[0]) for s in d], 62)]
  assert len(rows) == len(expected) == stats.instances
  for got, want in zip(rows, expected):
    np.testing.assert_array_equal(got, want)
  # A sentence longer than a block is cut into block-sized pieces (SpanBERT would skip it): nothing is lost.
  long = (np.arange(150, dtype=np.int32) + 7 * DOC_SPAN + 5000, np.ones(150, bool))
  docs[7].insert(1, long)
  arrays, _ = instances.make_instances(docs, "single", 64, SPECIAL, dupe_factor=5, seed=0)
  body = arrays["input_ids"][~np.isin(arrays["input_ids"], [SPECIAL.pad, SPECIAL.cls, SPECIAL.sep])]
  np.testing.assert_array_equal(np.sort(body), np.sort(np.concatenate([s[0] for d in docs for s in d])))


# ------------------------------------------------------------------ electra (google-research/electra's ExampleBuilder)

class _Scripted:
  """An rng whose random() gives `values` in order, and fails if asked for more: pins every draw."""

  def __init__(self, values):
    self.values = list(values)

  def random(self):
    return self.values.pop(0)


def _sentences(*lengths):
  ids = np.arange(100, 100 + sum(lengths), dtype=np.int32)
  cuts = np.cumsum((0,) + lengths)
  return [(ids[i:j], np.ones(j - i, bool)) for i, j in zip(cuts[:-1], cuts[1:])]


def _ids(segment):
  return None if segment is None else segment[0].tolist()


def test_electra_segments_follow_the_reference_rule():
  split = instances._electra_segments
  four = _sentences(10, 10, 10, 10)  # target 46: A's half is (46 - 3) // 2 = 21
  a, b, drawn = split(four, 46, 128, _Scripted([0.5, 0.9]))  # a pair; the coin of the sentence crossing 21: B
  assert not drawn and (len(a[0]), len(b[0])) == (20, 20)
  a, b, _ = split(four, 46, 128, _Scripted([0.5, 0.1]))  # coin: A, which is then over half: no more coins
  assert (len(a[0]), len(b[0])) == (30, 10)
  a, b, _ = split(_sentences(15, 10, 3), 46, 128, _Scripted([0.5, 0.9]))  # a short sentence after B began
  assert _ids(a) == list(range(100, 115)) + list(range(125, 128)) and _ids(b) == list(range(115, 125))
  a, b, drawn = split(four, 46, 128, _Scripted([0.05]))  # the 10% draw: one segment, no coin
  assert drawn and b is None and _ids(a) == list(range(100, 140))
  a, b, _ = split(_sentences(20, 60), 64, 64, _Scripted([0.5, 0.9]))  # B cut to 64 - 20 - 3 tokens
  assert (len(a[0]), len(b[0])) == (20, 41)
  a, b, _ = split(_sentences(70, 40), 64, 64, _Scripted([0.5]))  # A cut to 62 leaves B nothing
  assert len(a[0]) == 62 and b is None


def test_electra_short_targets_shorten_the_examples_and_rows_stay_in_one_document():
  docs = _docs(n_docs=20, min_sents=20, max_sents=30)
  full, full_stats = instances.make_instances(docs, "electra", 128, SPECIAL, short_seq_prob=0.0, seed=0)
  short, short_stats = instances.make_instances(docs, "electra", 128, SPECIAL, short_seq_prob=1.0, seed=0)
  assert full_stats.short_targets == 0 and short_stats.short_targets == short_stats.instances - 1  # all but the first
  # Targets uniform in [5, 128] fill rows about half as much as targets of 128.
  assert short["groups"].sum(1).mean() < 0.7 * full["groups"].sum(1).mean()
  for row in _rows(full):
    a, b = _segments(row)
    assert len(set((np.concatenate([a, b]) - 100) // DOC_SPAN)) == 1


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
  """The demo corpus (Python's topic docs) tokenized by a SentencePiece model trained on it (~1 s)."""
  docs = list(sources.documents("demo", sources.SourceStats()))
  prefix = str(tmp_path_factory.mktemp("spm") / "demo")
  tok = train_sentencepiece([s for d in docs for s in d], prefix, 2000, num_threads=1)
  encoded = [[e for e in map(tok.encode, d) if len(e[0])] for d in docs]
  return [d for d in encoded if d], tok.special


def test_electra_statistics_on_the_demo_corpus(demo):
  docs, special = demo
  seq = 128
  arrays, stats = instances.make_instances(docs, "electra", seq, special, short_seq_prob=0.05, dupe_factor=4, seed=0)
  n = stats.instances
  assert n == stats.examples == len(arrays["input_ids"]) > 3000, n
  # The two draws per example are Bernoulli: their counts stay within 4 binomial sigmas of n * p.
  for count, p in ((stats.one_segment_drawn, instances.ELECTRA_ONE_SEGMENT_PROB), (stats.short_targets, 0.05)):
    assert abs(count / n - p) < 4 * np.sqrt(p * (1 - p) / n), (count, n, p)
  ids, types, real = arrays["input_ids"], arrays["type_ids"], arrays["groups"] > 0
  length = real.sum(1)
  assert (real == (np.arange(seq) < length[:, None])).all() and (length <= seq).all()
  assert (ids[:, 0] == special.cls).all() and (ids[np.arange(n), length - 1] == special.sep).all()
  pair = (types == 1).any(1)
  # One-segment rows: the drawn ones, plus those of one sentence or with nothing left for B.
  assert (~pair).sum() == stats.one_segment >= stats.one_segment_drawn
  assert ((ids == special.sep).sum(1) == np.where(pair, 2, 1)).all()
  first_sep = (ids == special.sep).argmax(1)
  assert (types == ((np.arange(seq) > first_sep[:, None]) & real)).all(), "type 0 through A's [SEP], 1 after"
  n_a, n_b = first_sep - 1, length - first_sep - 2
  assert (n_a > 0).all() and (n_b[pair] > 0).all()
  # A is targeted at half the example (give or take the crossing sentence): about half of each pair.
  share_a = (n_a / (n_a + n_b))[pair]
  assert 0.45 < share_a.mean() < 0.6, share_a.mean()
