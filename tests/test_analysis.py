"""Attention analysis (bertjax.compress.analysis): the statistics on hand-made attention, and the command's files."""

import json
import os

import numpy as np
import pytest

from bertjax.compress import analysis

CLS, SEP = 2, 3


def _hand_made(n=6):
  """[1 layer, 5 heads, n, n] attention with a known answer, for ids [CLS] a b c d [SEP]."""
  p = np.zeros((1, 5, n, n))
  p[0, 0, :, 0] = 1.0  # head 0: everything on [CLS]
  p[0, 1] = 1.0 / n  # head 1: uniform
  p[0, 2, np.arange(1, n), np.arange(n - 1)] = 1.0  # head 2: the previous token ([CLS] attends to itself)
  p[0, 2, 0, 0] = 1.0
  p[0, 3, :, n - 1] = 0.5  # head 3: half on [SEP], half on the token itself
  p[0, 3, np.arange(n), np.arange(n)] += 0.5
  p[0, 4, np.arange(n - 1), np.arange(1, n)] = 1.0  # head 4: the next token ([SEP] attends to [CLS])
  p[0, 4, n - 1, 0] = 1.0
  return p, np.array([CLS, 10, 11, 12, 13, SEP])


def test_statistics_of_hand_made_attention():
  p, ids = _hand_made()
  assert np.allclose(p.sum(-1), 1.0)
  s = analysis.head_stats([(p, ids)], CLS, SEP)
  n = 6
  np.testing.assert_allclose(s["entropy"][0], [0, np.log(n), 0, np.log(2) * (n - 1) / n, 0], atol=1e-12)
  np.testing.assert_allclose(s["cls"][0], [1, 1 / n, 2 / n, 0.5 / n, 1 / n])  # head 2: [CLS] and the token after
  # head 3: [SEP]'s own row puts 0.5 + 0.5 on [SEP]
  np.testing.assert_allclose(s["sep"][0], [0, 1 / n, 0, (0.5 * (n - 1) + 1) / n, 1 / n])
  np.testing.assert_allclose(s["self"][0], [1 / n, 1 / n, 1 / n, (0.5 * (n - 1) + 1) / n, 0])
  np.testing.assert_allclose(s["prev"][0], [1 / (n - 1), 1 / n, 1, 0, 0])  # over the n - 1 queries with a previous token
  np.testing.assert_allclose(s["next"][0], [0, 1 / n, 0, 0.5 / (n - 1), 1])
  rows = analysis.table(s)
  assert len(rows) == 5 and rows[2]["prev"] == 1.0 and rows[0]["cls"] == 1.0


def test_inputs_of_different_lengths_average_over_all_query_tokens():
  p6, ids6 = _hand_made(6)
  p4, ids4 = _hand_made(4)
  s = analysis.head_stats([(p6, ids6), (p4, np.array([CLS, 10, 11, SEP]))], CLS, SEP)
  np.testing.assert_allclose(s["cls"][0, 1], (6 * (1 / 6) + 4 * (1 / 4)) / 10)  # uniform head: 2 of 10 tokens
  np.testing.assert_allclose(s["prev"][0, 2], 1.0)
  with pytest.raises(analysis.UserError, match="no input"):
    analysis.head_stats([], CLS, SEP)


def test_the_command_writes_its_json_and_png(tmp_path, capsys):
  """On a random micro model imported from HF files: padded batches give the stats of unpadded inputs."""
  from bertjax.data.tokenizer_spec import load_tokenizer
  from bertjax.hf import convert, inference, tokenizers as hf_tokenizers
  from conftest import micro

  words = "the a cat dog sat on mat and ran to house".split()
  (tmp_path / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] + words) + "\n")
  cfg = micro("configs/bert.py:tiny", **{"model.vocab_size": 16})
  convert.write_hf(cfg, convert.init_params(cfg, seed=0), str(tmp_path / "hf"),
                   load_tokenizer(f"wordpiece:{tmp_path / 'vocab.txt'}"))
  texts = ["the cat sat on the mat and the dog ran to the house", "a dog ran"]
  (tmp_path / "texts.txt").write_text("\n\n".join(texts) + "\n")
  out = str(tmp_path / "out")
  result = analysis.run(str(tmp_path / "hf"), "", str(tmp_path / "texts.txt"), out)
  assert result["inputs"] == 2 and len(result["heads"]) == 2 * 2
  saved = json.load(open(os.path.join(out, "attention.json")))
  assert saved["heads"] == result["heads"] and os.path.getsize(os.path.join(out, "attention.png")) > 0
  assert "wrote" in capsys.readouterr().out
  # The same statistics from each input run alone, unpadded.
  loaded = inference.load(hf_dir=str(tmp_path / "hf"))
  alone = []
  for t in texts:
    ids, types = hf_tokenizers.encode_example(loaded.tokenizer, t, None, 128)
    alone.append((inference.attention_probs(loaded.config, loaded.params, [ids], [types])[:, 0], ids))
  expected = analysis.head_stats(alone, CLS, SEP)
  for name in analysis.STATS:
    np.testing.assert_allclose(np.asarray(saved["arrays"][name]), expected[name], atol=1e-5)
