"""Masking that draws from the corpus token counts: SpanBERT's unigram replacements (masking.replace_dist) and
DistilBERT's smoothed choice of tokens (masking.smoothing), and their validation."""

import jax
import numpy as np
import pytest

from bertjax.objectives import masking
from test_masking import _batch, S, SPECIAL, VOCAB, VOCAB_FACTS


def test_unigram_replacements_follow_the_corpus_counts_and_never_a_special_id():
  """masking.replace_dist=unigram (SpanBERT's np.random.choice over the corpus token stream): a replaced token
  is id i with probability count_i / sum, special ids (even with counts) never (uniform draws: tests/test_masking.py)."""
  counts = np.zeros(VOCAB, np.int64)
  counts[[5, 6, 7, 900]] = [600, 300, 99, 1]
  counts[list(SPECIAL)] = 1000  # [CLS]/[SEP] are in a stream of rows; they are never drawn
  ids, ws = _batch(3)
  cfg = masking.MaskingConfig(*VOCAB_FACTS, max_predictions=masking.max_predictions(S, 0.15), mask_token_prob=0.0,
                              random_token_prob=1.0, replace_dist="unigram")
  out = jax.tree.map(np.asarray, jax.jit(masking.mask_batch, static_argnums=3)(jax.random.key(0), ids, ws, cfg, counts))
  rows, slots = np.nonzero(out["mlm_weights"] > 0)
  draws = out["input_ids"][rows, out["mlm_positions"][rows, slots]]
  assert len(draws) > 3_000 and set(np.unique(draws)) <= {5, 6, 7, 900}
  share = np.bincount(draws, minlength=VOCAB)[[5, 6, 7]] / len(draws)
  np.testing.assert_allclose(share, [0.6, 0.3, 0.099], atol=0.025)


def test_smoothing_chooses_a_token_with_probability_count_to_the_minus_s():
  """masking.smoothing s (DistilBERT's mlm_smoothing 0.7): with one token to choose among six, a rare token
  (count 10) among five common ones (count 1000) is chosen with probability w_r / (w_r + 5 w_c), w = count^-s
  (distiller.py's multinomial draw over token_probs), where s = 0 would give 1/6."""
  b = 3000
  ids = np.zeros((b, 16), np.int32)
  ids[:, 0], ids[:, 7] = 2, 3
  ids[:, 1:7] = 20  # common
  ids[np.arange(b), 1 + np.arange(b) % 6] = 30  # the rare one, at every place in turn
  counts = np.ones(VOCAB, np.int64)
  counts[20], counts[30] = 1000, 10
  expected = 10 ** -0.7 / (10 ** -0.7 + 5 * 1000 ** -0.7)  # 0.834
  cfg = masking.MaskingConfig(*VOCAB_FACTS, max_predictions=3, smoothing=0.7)
  out = jax.tree.map(np.asarray, jax.jit(masking.mask_batch, static_argnums=3)(
      jax.random.key(1), ids, np.ones_like(ids, bool), cfg, counts))
  assert (out["mlm_weights"].sum(1) == 1).all()  # round(6 x 0.15) = 1 token a row
  chosen = ids[np.arange(b), out["mlm_positions"][:, 0]]
  assert abs((chosen == 30).mean() - expected) < 0.025, ((chosen == 30).mean(), expected)


def test_replace_dist_and_smoothing_are_validated():
  from bertjax.core.config import defaults
  from bertjax.core.errors import UserError

  for key, value, message in (("replace_dist", "zipf", "use uniform or unigram"), ("smoothing", -0.5, ">= 0")):
    c = defaults()
    c.masking[key] = value
    with pytest.raises(UserError, match=message):
      masking.validate(c)
  c = defaults()
  c.masking.scheme, c.masking.smoothing = "span", 0.7
  with pytest.raises(UserError, match="scheme=token"):
    masking.validate(c)
