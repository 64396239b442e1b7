"""NSP/SOP instances: label balance, where segments come from, never NSP for SOP, counts of short documents."""

import numpy as np

from bertjax.data import instances
from bertjax.data.tokenizer import SpecialIds

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
