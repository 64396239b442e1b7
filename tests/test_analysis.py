"""Attention analysis (bertjax.compress.analysis): Clark et al.'s statistics on hand-made attention with known
answers, their sentence-pair inputs, and the command's files."""

import json
import os
import random

import numpy as np
import pytest

from bertjax.compress import analysis
from bertjax.data.tokenizer import SpecialIds

CLS, SEP, DOT = 2, 3, 9


def _pair_map():
  """[1 layer, 5 heads, 6, 6] attention of the pair [CLS] a . [SEP] b [SEP], each head with a known answer."""
  n = 6
  p = np.zeros((1, 5, n, n))
  p[0, 0, :, 0] = 1.0  # head 0: everything on [CLS]
  p[0, 1] = 1.0 / n  # head 1: uniform
  p[0, 2, :, 0] = 1.0  # head 2: [SEP] queries on themselves, every other query on [CLS]
  p[0, 2, [3, 5]] = 0.0
  p[0, 2, 3, 3] = p[0, 2, 5, 5] = 1.0
  p[0, 3, :, 2] = 1.0  # head 3: everything on "."
  p[0, 4, np.arange(1, n - 1), np.arange(0, n - 2)] = 0.5  # head 4: half on the previous, half on the next token
  p[0, 4, np.arange(1, n - 1), np.arange(2, n)] = 0.5
  p[0, 4, 0, 1] = p[0, 4, n - 1, n - 2] = 1.0  # ... all on the only neighbour at the edges
  return p, np.array([CLS, 10, DOT, SEP, 11, SEP])


def test_clark_statistics_of_hand_made_attention():
  p, ids = _pair_map()
  assert np.allclose(p.sum(-1), 1.0)
  s = analysis.head_stats([(p, ids)], CLS, SEP, punct_ids=(DOT,))
  n, ln2 = 6, np.log(2)
  expected = {  # heads 0..4
      "entropy": [0, np.log(n), 0, 0, 4 * ln2 / n],
      "entropy_cls": [0, np.log(n), 0, 0, 0],
      "cls": [1, 1 / n, 4 / n, 0, 0.5 / n],
      "sep": [0, 2 / n, 2 / n, 0, 1.5 / n],  # head 4: "." -> [SEP] 0.5, b -> both [SEP]s 0.5 + 0.5
      "sep_sep": [0, 2 / n, 1, 0, 0],  # the 2 [SEP] queries' share on [SEP]s
      "rest_sep": [0, 2 / n, 0, 0, 1.5 / 4],  # the other 4 queries'
      "punct": [0, 1 / n, 0, 1, 1 / n],
      "self": [1 / n, 1 / n, 3 / n, 1 / n, 0],
      "prev": [1 / n, 5 / n ** 2, 1 / n, 1 / n, 3 / n],  # Clark's "left": divided by all n queries
      "next": [0, 5 / n ** 2, 0, 1 / n, 3 / n],
  }
  assert set(expected) == set(analysis.STATS)
  for name, want in expected.items():
    np.testing.assert_allclose(s[name][0], want, atol=1e-12, err_msg=name)
  rows = analysis.table(s)
  assert len(rows) == 5 and rows[2]["sep_sep"] == 1.0 and rows[2]["rest_sep"] == 0.0 and rows[3]["punct"] == 1.0


def test_means_are_per_document_not_per_token():
  p, ids = _pair_map()
  single = np.full((1, 5, 4, 4), 0.25)  # uniform over [CLS] a b [SEP]: one [SEP]
  no_sep = np.full((1, 5, 3, 3), 1 / 3)  # uniform over [CLS] a b: no [SEP] query, so no sep_sep
  s = analysis.head_stats([(p, ids), (single, [CLS, 10, 11, SEP]), (no_sep, [CLS, 10, 11])], CLS, SEP, (DOT,))
  np.testing.assert_allclose(s["cls"][0, 1], (1 / 6 + 1 / 4 + 1 / 3) / 3)  # token-weighted would be 3 / 13
  np.testing.assert_allclose(s["sep_sep"][0, 1], (2 / 6 + 1 / 4) / 2)  # over the 2 inputs that have a [SEP]
  np.testing.assert_allclose(s["rest_sep"][0, 1], (2 / 6 + 1 / 4 + 0) / 3)
  np.testing.assert_allclose(s["entropy"][0, 1], (np.log(6) + np.log(4) + np.log(3)) / 3)
  with pytest.raises(analysis.UserError, match="no input"):
    analysis.head_stats([], CLS, SEP)


class _Words:
  """A stand-in tokenizer: a sentence's tokens are its words, each word its integer id."""

  special = SpecialIds(pad=0, unk=1, cls=CLS, sep=SEP, mask=4)

  def encode(self, text):
    ids = np.asarray([int(w) for w in text.split()], np.int32)
    return ids, np.ones_like(ids, bool)


def test_document_pairs_are_clark_et_al_inputs():
  tok = _Words()
  s = lambda *w: " ".join(map(str, w))
  # Short sentences, nothing to truncate: chunks close at 4 tokens (max_len 7 - 3 special tokens), a chunk of
  # two sentences splits after the first; the last sentence alone has no B, which ends its document; a
  # one-sentence document gives nothing.
  docs = [[s(10, 11), s(12, 13), s(14, 15), s(16, 17), s(18, 19)], [s(20, 21)], [s(30), s(31, 32, 33)]]
  pairs = analysis.document_pairs(docs, tok, max_len=7)
  assert pairs == [([CLS, 10, 11, SEP, 12, 13, SEP], [0, 0, 0, 0, 1, 1, 1]),
                   ([CLS, 14, 15, SEP, 16, 17, SEP], [0, 0, 0, 0, 1, 1, 1]),
                   ([CLS, 30, SEP, 31, 32, 33, SEP], [0, 0, 0, 1, 1, 1, 1])]
  assert analysis.document_pairs(docs, tok, max_len=7, max_inputs=2) == pairs[:2]
  # Too long: the longer segment loses its first or last token on each coin flip of one Random(seed), drawn
  # after the split point's randint, as truncate_seq_pair does.
  a, b = [40, 41, 42, 43, 44], [50, 51, 52]
  (ids, types), = analysis.document_pairs([[s(*a), s(*b)]], tok, max_len=9, seed=3)
  rng = random.Random(3)
  assert rng.randint(1, 1) == 1
  for _ in range(2):  # 8 tokens -> 6: A (the longer) loses two
    del a[0 if rng.random() < 0.5 else -1]
  assert ids == [CLS, *a, SEP, *b, SEP] and types == [0] * 5 + [1] * 4


def test_the_command_on_pairs_and_documents(tmp_path, capsys):
  """On a random micro model imported from HF files: padded batches give the stats of unpadded inputs."""
  from bertjax.data.tokenizer_spec import load_tokenizer
  from bertjax.hf import convert, inference, tokenizers as hf_tokenizers
  from conftest import micro

  words = "the a cat dog sat on mat and ran to house . ,".split()
  (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words) + "\n")
  cfg = micro("configs/bert.py:tiny", **{"model.vocab_size": 18})
  convert.write_hf(cfg, convert.init_params(cfg, seed=0), str(tmp_path / "hf"),
                   load_tokenizer(f"wordpiece:{tmp_path / 'vocab.txt'}"))
  lines = ["the cat sat on the mat , and the dog ran\tto the house .", "a dog ran"]
  (tmp_path / "texts.txt").write_text("\n\n".join(lines) + "\n")
  out = str(tmp_path / "out")
  result = analysis.run(str(tmp_path / "hf"), "", str(tmp_path / "texts.txt"), out)
  assert result["inputs"] == 2 and len(result["heads"]) == 2 * 2
  saved = json.load(open(os.path.join(out, "attention.json")))
  assert saved["heads"] == result["heads"] and os.path.getsize(os.path.join(out, "attention.png")) > 0
  assert "wrote" in capsys.readouterr().out
  # The same statistics from each input run alone, unpadded: the first a pair, the second a single segment.
  loaded = inference.load(hf_dir=str(tmp_path / "hf"))
  tok = loaded.tokenizer
  assert sorted(analysis.punctuation_ids(tok)) == [16, 17]
  alone = []
  for line in lines:
    a, _, b = line.partition("\t")
    ids, types = hf_tokenizers.encode_example(tok, a, b or None, 128)
    alone.append((inference.attention_probs(loaded.config, loaded.params, [ids], [types])[:, 0], ids))
  assert alone[0][1].count(SEP) == 2 and alone[1][1].count(SEP) == 1
  expected = analysis.head_stats(alone, CLS, SEP, (16, 17))
  for name in analysis.STATS:
    np.testing.assert_allclose(np.asarray(saved["arrays"][name]), expected[name], atol=1e-5)
  assert np.asarray(saved["arrays"]["punct"]).min() > 0
  # documents: the two sentences of the first document make one pair; the one-sentence document none.
  (tmp_path / "docs.txt").write_text("the cat sat on the mat .\nthe dog ran to the house .\n\na dog ran\n")
  result = analysis.run(str(tmp_path / "hf"), "", str(tmp_path / "docs.txt"), out, input_format="documents")
  assert result["inputs"] == 1 and result["tokens"] == 3 + 7 + 7
  with pytest.raises(analysis.UserError, match="input_format"):
    analysis.run(str(tmp_path / "hf"), "", str(tmp_path / "docs.txt"), out, input_format="pairs")
