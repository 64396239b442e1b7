"""Masking statistics over many draws: rates, 80/10/10, never specials or padding, spans and n-grams."""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.objectives import masking, sbo

SPECIAL = (0, 1, 2, 3, 4)
MASK, VOCAB = 4, 1000
VOCAB_FACTS = (SPECIAL, MASK, VOCAB)  # MaskingConfig's special_ids, mask_id, vocab_size
B, S = 256, 128


def _batch(seed=0, word_prob=0.5):
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, VOCAB, (B, S)).astype(np.int32)
  ids[:, 0], ids[:, 50] = 2, 3  # [CLS] ... [SEP]
  lengths = rng.integers(60, S, B)
  for b, n in enumerate(lengths):
    ids[b, n - 1], ids[b, n:] = 3, 0  # final [SEP], then padding
  word_start = rng.random((B, S)) < word_prob
  return ids, word_start


def _run(scheme, seed=0, **kw):
  ids, ws = _batch(seed)
  cfg = masking.MaskingConfig(*VOCAB_FACTS, scheme=scheme,
                              max_predictions=masking.max_predictions(S, kw.get("mask_prob", 0.15)), **kw)
  out = jax.jit(lambda r: masking.mask_batch(r, ids, ws, cfg))(
      jax.random.key(seed))
  out = jax.tree.map(np.asarray, out)
  chosen = np.zeros_like(ids, bool)
  for b in range(B):
    chosen[b, out["mlm_positions"][b][out["mlm_weights"][b] > 0]] = True
  return ids, ws, out, chosen


def test_max_predictions_is_derived():
  assert masking.max_predictions(128, 0.15) == 20
  assert masking.max_predictions(512, 0.15) == 77
  assert masking.max_predictions(512, 0.25) == 128


@pytest.mark.parametrize("scheme", masking.SCHEMES)
def test_rate_and_never_special_or_padding(scheme):
  ids, _, out, chosen = _run(scheme)
  candidates = ~np.isin(ids, SPECIAL)
  assert not chosen[~candidates].any(), "a special token or padding was chosen"
  rate = chosen.sum() / candidates.sum()
  assert abs(rate - 0.15) < 0.01, rate
  # Unchosen positions are untouched; labels are the original ids at the chosen positions.
  np.testing.assert_array_equal(out["input_ids"][~chosen], ids[~chosen])
  w = out["mlm_weights"] > 0
  np.testing.assert_array_equal(out["mlm_labels"][w], np.take_along_axis(ids, out["mlm_positions"], 1)[w])
  assert out["mlm_weights"].shape == (B, masking.max_predictions(S, 0.15))


def test_80_10_10_split():
  ids, _, out, chosen = _run("token")
  new = out["input_ids"][chosen]
  orig = ids[chosen]
  is_mask = new == MASK
  kept = new == orig
  rand = ~is_mask & ~kept
  assert abs(is_mask.mean() - 0.8) < 0.02
  assert abs(kept.mean() - 0.1 - 0.1 / VOCAB) < 0.02  # a random token can equal the original
  assert abs(rand.mean() - 0.1) < 0.02
  assert not np.isin(new[rand], SPECIAL).any()


def test_electra_85_15_no_random():
  ids, _, out, chosen = _run("token", mask_token_prob=0.85, random_token_prob=0.0)
  new, orig = out["input_ids"][chosen], ids[chosen]
  assert abs((new == MASK).mean() - 0.85) < 0.02
  assert ((new == MASK) | (new == orig)).all()


def test_fresh_mask_per_rng_and_reproducible():
  _, _, a, _ = _run("token", seed=0)
  ids, ws = _batch(0)
  cfg = masking.MaskingConfig(*VOCAB_FACTS, max_predictions=20)
  f = lambda r: masking.mask_batch(r, ids, ws, cfg)
  same = f(jax.random.key(0))
  other = f(jax.random.key(1))
  np.testing.assert_array_equal(np.asarray(same["mlm_positions"]), a["mlm_positions"])
  assert (np.asarray(other["mlm_positions"]) != a["mlm_positions"]).mean() > 0.5


def _words(ws_row, cand_row):
  """Word index per candidate token, as the masking code defines words."""
  prev = np.concatenate([[False], cand_row[:-1]])
  starts = cand_row & (ws_row | ~prev)
  return np.where(cand_row, np.cumsum(starts) - 1, -1)


@pytest.mark.parametrize("scheme", ["whole_word", "ngram", "span"])
def test_word_schemes_mask_whole_words(scheme):
  ids, ws, _, chosen = _run(scheme)
  cand = ~np.isin(ids, SPECIAL)
  for b in range(32):
    words = _words(ws[b], cand[b])
    partial = [w for w in np.unique(words[chosen[b]]) if not chosen[b][words == w].all()]
    # SpanBERT stops its last span the moment the budget is full, inside a word if need be (one per row).
    assert len(partial) <= (scheme == "span"), f"{scheme}: words {partial} partly masked"


def _span_lengths(scheme, **kw):
  """Lengths (in words) of the maximal runs of masked words; approximates the sampled span lengths."""
  ids, ws, _, chosen = _run(scheme, **kw)
  cand = ~np.isin(ids, SPECIAL)
  lengths = []
  for b in range(B):
    words = _words(ws[b], cand[b])
    masked = np.zeros(words.max() + 1, bool)
    masked[words[chosen[b]]] = True
    run = 0
    for m in list(masked) + [False]:
      if m:
        run += 1
      elif run:
        lengths.append(run)
        run = 0
  return np.asarray(lengths)


def test_ngram_span_statistics():
  """ALBERT n-grams: p(n) proportional to 1/n for n <= 3, so the mean span is (1+1+1)/(1+1/2+1/3) = 1.64.
  Adjacent spans merge into longer runs, so runs are somewhat longer than spans, but never unbounded."""
  probs = masking.span_length_probs(masking.MaskingConfig(*VOCAB_FACTS, scheme="ngram"))
  np.testing.assert_allclose(probs, np.array([1, 1 / 2, 1 / 3]) / (1 + 1 / 2 + 1 / 3))
  lengths = _span_lengths("ngram")
  whole = _span_lengths("whole_word")
  assert 1.4 < lengths.mean() < 2.3, lengths.mean()
  assert lengths.mean() > whole.mean() + 0.2  # n-grams really are longer than single words
  assert (lengths >= 2).mean() > 0.3


def test_span_scheme_is_geometric_and_clipped():
  cfg = masking.MaskingConfig(*VOCAB_FACTS, scheme="span", span_p=0.2, max_span=10)
  probs = masking.span_length_probs(cfg)
  assert len(probs) == 10 and np.isclose(probs.sum(), 1)
  np.testing.assert_allclose(probs[1:] / probs[:-1], 0.8)
  mean = (np.arange(1, 11) * probs).sum()
  assert 3.5 < mean < 4.0  # SpanBERT reports a mean span length of 3.8 words
  # A 15% budget of short rows cuts the long spans short (SpanBERT's sampler stops at the budget), so the
  # realised runs differ from 3.8 words but are clearly longer than ALBERT's n-grams.
  spans, ngrams = _span_lengths("span").mean(), _span_lengths("ngram").mean()
  assert spans > ngrams + 0.3, (spans, ngrams)


def _runs(selected_row):
  """(start, end) of each maximal run of selected tokens: SpanBERT's spans after merge_intervals."""
  padded = np.concatenate([[False], selected_row, [False]]).astype(np.int8)
  edges = np.flatnonzero(np.diff(padded))
  return list(zip(edges[::2], edges[1::2]))


def test_span_action_is_per_span():
  """SpanBERT decides [MASK] / random / keep once per merged span (span_masking draws one number per span):
  every token of a span gets the same action, and the actions over spans split 80/10/10."""
  ids, _, out, chosen = _run("span")
  actions = []
  for b in range(B):
    for start, end in _runs(chosen[b]):
      new, orig = out["input_ids"][b, start:end], ids[b, start:end]
      kind = np.where(new == MASK, 0, np.where(new == orig, 1, 2))  # mask / kept / random
      if end - start > 1:
        actions.append(kind)
  multi = len(actions)
  assert multi > 500  # many spans of several tokens
  # A random token equals the original 1 time in VOCAB: a random span may show a kept token, nothing else.
  mixed = [k for k in actions if len(set(k.tolist()) - ({1} if 2 in k else set())) > 1]
  assert not mixed, f"{len(mixed)} of {multi} spans mix actions, e.g. {mixed[:3]}"
  first = np.asarray([k.max() if 2 in k else k[0] for k in actions])
  assert abs((first == 0).mean() - 0.8) < 0.05 and abs((first == 2).mean() - 0.1) < 0.04


def _spanbert_reference(word_start, budget, lengths, uniforms):
  """facebookresearch/SpanBERT's PairWithSpanMaskingScheme.mask, ported to plain Python on one text segment
  (no [CLS]/[SEP]) with its random draws given: `lengths[i]` the i-th span length in words, and an anchor
  drawn uniformly among the unmasked tokens (the reference redraws an anchor that is already masked, which is
  the same distribution) as the unmasked token with the largest `uniforms[i]`. Returns the masked positions and
  the spans ([first, last] token, as the reference records them for span_masking)."""
  n = len(word_start)

  def word_begin(i):  # get_word_start: back to the token that starts a word
    while i > 0 and not word_start[i]:
      i -= 1
    return i

  def word_end(i):  # get_word_end: the next word's first token
    i += 1
    while i < n and not word_start[i]:
      i += 1
    return i

  mask, spans = set(), []
  for span_len, u in zip(lengths, uniforms):
    if len(mask) >= budget:
      break
    anchor = max((i for i in range(n) if i not in mask), key=lambda i: u[i])
    left, right = word_begin(anchor), word_end(anchor)
    spans.append([left, left])
    for i in range(left, right):
      if len(mask) >= budget:
        break
      mask.add(i)
      spans[-1][-1] = i
    words = 1
    while words < span_len and right < n and len(mask) < budget:
      left, right = right, word_end(right)
      words += 1
      for i in range(left, right):
        if len(mask) >= budget:
          break
        mask.add(i)
        spans[-1][-1] = i
  return mask, spans


def _spanbert_pair_targets(spans, n, max_pair_targets=15):
  """SpanBERT's masking.py merge_intervals and span_masking (endpoints "external") with pad_to_len at
  --max-pair-targets 15 (pretraining/README.md): for each merged span not touching the segment's edges, its
  boundaries (start - 1, end + 1) and its first 15 tokens as SBO targets. Returns {(target, left, right)}."""
  merged = []
  for interval in sorted(spans, key=lambda x: x[0]):
    if not merged or merged[-1][1] + 1 < interval[0]:
      merged.append(list(interval))
    else:
      merged[-1][1] = max(merged[-1][1], interval[1])
  out = set()
  for start, end in merged:
    if start > 0 and end < n - 1:
      targets = list(range(start, end + 1))[:max_pair_targets]  # pad_to_len(..., pad_len + 2) keeps 2 + 15
      out |= {(t, start - 1, end + 1) for t in targets}
  return out


def test_span_sampler_matches_a_port_of_spanbert_s_with_the_same_draws():
  """Single-segment rows ([CLS] text [SEP], as SpanBERT trains): the masked tokens of every row equal those
  of the reference sampler given the same draws (geometric(0.2) lengths clipped at 10 words, anchors), so
  span lengths in words, word-start alignment, merging and the ceil(15%) budget cut all follow SpanBERT; and
  the SBO targets (merged spans, their external boundaries, the first 15 tokens of each) are SpanBERT's."""
  rows = 24
  rng = np.random.default_rng(5)
  ids = rng.integers(5, VOCAB, (rows, S)).astype(np.int32)
  lengths_tok = rng.integers(40, S, rows)
  ids[:, 0] = 2
  for b, n in enumerate(lengths_tok):
    ids[b, n - 1], ids[b, n:] = 3, 0
  ws = rng.random((rows, S)) < 0.6
  cfg = masking.MaskingConfig(*VOCAB_FACTS, scheme="span", max_predictions=masking.max_predictions(S, 0.15))
  key = jax.random.key(11)
  out = jax.tree.map(np.asarray, masking.mask_batch(key, jnp.asarray(ids), jnp.asarray(ws), cfg))
  # The draws mask_batch makes for row b: its selection stream, split per row, then (lengths, anchors).
  row_keys = jax.random.split(jax.random.split(key, 3)[0], rows)
  probs = jnp.asarray(masking.span_length_probs(cfg))
  p = cfg.max_predictions
  long_spans = 0
  for b in range(rows):
    r_len, r_anchor = jax.random.split(row_keys[b])
    draws = np.asarray(jax.random.choice(r_len, 10, (p,), p=probs)) + 1
    uniforms = np.asarray(jax.vmap(lambda i: jax.random.uniform(jax.random.fold_in(r_anchor, i), (S,)))(
        jnp.arange(p)))
    n = int(lengths_tok[b]) - 2  # text tokens between [CLS] and [SEP]
    budget = math.ceil(n * 0.15)
    text_ws = ws[b, 1:n + 1].copy()
    text_ws[0] = True
    expected, spans = _spanbert_reference(text_ws, budget, draws, uniforms[:, 1:n + 1])
    got = out["mlm_positions"][b][out["mlm_weights"][b] > 0] - 1
    assert sorted(got.tolist()) == sorted(expected), b
    # bertjax positions count [CLS]; SpanBERT's pair targets are offsets in the text (its dataset adds 1 later).
    weighted = sbo.weights(out)[b] > 0
    targets = {(p - 1, l - 1, r - 1) for p, l, r in zip(out["mlm_positions"][b][weighted],
                                                       out["span_left"][b][weighted], out["span_right"][b][weighted])}
    assert targets == _spanbert_pair_targets(spans, n), b
    long_spans += any(e - s_ >= 15 for s_, e in spans)
  assert long_spans, "no span reached the 15-target cap: the cap went untested"


def _albert_ngrams(word_tokens, order, n_of, budget):
  """The n-gram branch of create_masked_lm_predictions (google-research/albert create_pretraining_data.py)
  with its random draws given: start words in `order`, `n_of[w]` the n drawn at word w. Returns the
  masked token positions."""
  covered, masked = set(), []
  for w in order:
    if len(masked) >= budget:
      break
    n = n_of[w]
    index_set = sum(word_tokens[w:w + n], [])
    n -= 1
    while len(masked) + len(index_set) > budget:  # the next shorter n-gram, down to the word alone
      if n == 0:
        break
      index_set = sum(word_tokens[w:w + n], [])
      n -= 1
    if len(masked) + len(index_set) > budget or any(i in covered for i in index_set):
      continue
    covered.update(index_set)
    masked.extend(index_set)
  return covered


def test_ngram_overflow_shortens_like_albert():
  """Given the same word order and drawn n, bertjax's n-grams are ALBERT's, token for token: an n-gram
  that would overflow the budget is shortened, not skipped."""
  # Six one-token words tried in order, budget 2, every n drawn as 3: ALBERT shortens the first trigram to
  # a bigram; skipping would pass over every trigram up to the one cut short by the end of the row.
  unit, order, n_of = jnp.arange(6), jnp.arange(6), jnp.full(6, 3)
  covered, _ = masking._greedy_spans(unit, 2, order, n_of, 3, shorten=True)
  np.testing.assert_array_equal(covered, [1, 1, 0, 0, 0, 0])
  skipped, _ = masking._greedy_spans(unit, 2, order, n_of, 3, shorten=False)
  np.testing.assert_array_equal(skipped, [0, 0, 0, 0, 1, 1])
  # Random words of 1-3 tokens around special tokens, random orders, draws and budgets.
  rng = np.random.default_rng(0)
  cases, s = 300, 24
  units, orders, lengths, budgets = [], [], [], []
  for _ in range(cases):
    cand = rng.random(s) > 0.1
    starts = cand & ((rng.random(s) < 0.5) | ~np.concatenate([[False], cand[:-1]]))
    unit_row = np.where(cand, np.cumsum(starts) - 1, -1)
    num = unit_row.max() + 1
    units.append(unit_row)
    orders.append(np.concatenate([rng.permutation(num), np.arange(num, s)]))
    lengths.append(rng.integers(1, 4, s))
    budgets.append(rng.integers(1, 9))
  covered = jax.jit(jax.vmap(lambda u, n, o, l: masking._greedy_spans(u, n, o, l, 3, shorten=True)[0]))(
      *map(jnp.asarray, (units, budgets, orders, lengths)))
  covered = np.asarray(covered)
  for c in range(cases):
    num = units[c].max() + 1
    word_tokens = [list(np.flatnonzero(units[c] == w)) for w in range(num)]
    theirs = _albert_ngrams(word_tokens, list(orders[c][:num]), lengths[c], budgets[c])
    ours = set(np.flatnonzero((units[c] >= 0) & covered[c][np.maximum(units[c], 0)]))
    assert ours == theirs, c


def test_ngram_fills_a_budget_skipping_would_leave_short():
  """Rows of one-token words with a budget of 2: a shortened n-gram always completes the budget (the first
  span takes 1 or 2 words, then any free word fits), where skipping n-grams that overflow leaves rows short."""
  rng = np.random.default_rng(0)
  ids = np.zeros((B, 12), np.int32)
  for b, k in enumerate(rng.integers(3, 10, B)):
    ids[b, 0], ids[b, 1:k + 1], ids[b, k + 1] = 2, rng.integers(5, VOCAB, k), 3
  cfg = masking.MaskingConfig(*VOCAB_FACTS, scheme="ngram", mask_prob=0.5, max_predictions=2)
  out = jax.jit(lambda r: masking.mask_batch(r, ids, np.ones_like(ids, bool), cfg))(jax.random.key(0))
  np.testing.assert_array_equal(np.asarray(out["mlm_weights"]).sum(1), 2)


def test_span_scheme_fills_spanbert_s_budget_from_word_starts():
  """SpanBERT's sampler masks exactly ceil(15%) of the text tokens of a row (its last span cut to fit),
  and every maximal run of masked tokens begins at a word's first token."""
  ids, ws, out, chosen = _run("span")
  cand = ~np.isin(ids, SPECIAL)
  budget = np.minimum(np.ceil(cand.sum(1) * 0.15 - 1e-9), masking.max_predictions(S, 0.15))
  np.testing.assert_array_equal(chosen.sum(1), budget)
  for b in range(B):
    words = _words(ws[b], cand[b])
    run_starts = np.flatnonzero(chosen[b] & ~np.concatenate([[False], chosen[b][:-1]]))
    assert all(words[p - 1] != words[p] for p in run_starts), "a span starts inside a word"


def test_span_boundaries_at_the_sequence_edges():
  """A span's SBO boundaries are the tokens just outside its run of masked tokens; a span touching [CLS]
  or [SEP] has no SBO target (SpanBERT masks the text without them and skips edge spans)."""
  #            [CLS] a    b    c    d    e   [SEP]  f    g  [SEP] [PAD]
  ids = np.array([[2, 10, 11, 12, 13, 14, 3, 15, 16, 3, 0]])
  selected = np.zeros_like(ids, bool)
  selected[0, [1, 2, 4, 7, 8]] = True  # a b (at [CLS]), d (inside), f g (between [SEP]s)
  positions = np.array([[1, 2, 4, 7, 8, 0]])
  weights = np.array([[1, 1, 1, 1, 1, 0]], np.float32)
  out = jax.tree.map(np.asarray, masking.span_boundaries(jnp.asarray(selected), jnp.asarray(~np.isin(ids, SPECIAL)),
                                                         jnp.asarray(positions), jnp.asarray(weights)))
  np.testing.assert_array_equal(out["span_left"][0, :5], [0, 0, 3, 6, 6])
  np.testing.assert_array_equal(out["span_right"][0, :5], [3, 3, 5, 9, 9])
  np.testing.assert_array_equal(out["span_weights"][0], [0, 0, 1, 0, 0, 0])
  # From the sampler: every weighted slot lies in a run of masked tokens bounded by two unmasked text tokens.
  ids, _, out, chosen = _run("span")
  cand = ~np.isin(ids, SPECIAL)
  w = out["span_weights"] > 0
  assert 0.7 < w.sum() / (out["mlm_weights"] > 0).sum() < 1.0  # most spans are inside the text, not all
  for b, k in zip(*np.nonzero(w)):
    left, right, pos = out["span_left"][b, k], out["span_right"][b, k], out["mlm_positions"][b, k]
    assert left < pos < right and cand[b, left] and cand[b, right]
    assert not chosen[b, left] and not chosen[b, right] and chosen[b, left + 1:right].all()


def test_wso_shuffles_unmasked_trigrams_out_of_order():
  ids, ws = _batch(1)
  cfg = masking.MaskingConfig(*VOCAB_FACTS, max_predictions=20, shuffle_share=0.05,
                              max_shuffled=masking.shuffle_slots(S, 0.05))
  out = jax.tree.map(np.asarray, jax.jit(lambda r: masking.mask_batch(r, ids, ws, cfg))(jax.random.key(0)))
  plain = masking.mask_batch(jax.random.key(0), ids, ws, dataclasses.replace(cfg, shuffle_share=0.0))
  np.testing.assert_array_equal(out["mlm_positions"], plain["mlm_positions"])  # its own random stream
  chosen = np.zeros_like(ids, bool)
  for b in range(B):
    chosen[b, out["mlm_positions"][b][out["mlm_weights"][b] > 0]] = True
  free = ~np.isin(ids, SPECIAL) & ~chosen
  counts = []
  for b in range(0, B, 4):  # a quarter of the rows: enough to see, and quick
    pos = out["wso_positions"][b][out["wso_weights"][b] > 0].reshape(-1, 3)
    np.testing.assert_array_equal(pos, pos[:, :1] + np.arange(3))  # trigrams of consecutive positions
    assert free[b, pos].all(), "a shuffled token was special or MLM-masked"
    np.testing.assert_array_equal(out["wso_labels"][b][out["wso_weights"][b] > 0], ids[b, pos.ravel()])
    for p in pos:
      np.testing.assert_array_equal(np.sort(out["input_ids"][b, p]), np.sort(ids[b, p]))  # a permutation ...
      if len(set(ids[b, p])) == 3:
        assert (out["input_ids"][b, p] != ids[b, p]).any()  # ... never the identity
    touched = chosen[b].copy()
    touched[pos.ravel()] = True
    np.testing.assert_array_equal(out["input_ids"][b, ~touched], ids[b, ~touched])
    trigrams = (free[b, :-2] & free[b, 1:-1] & free[b, 2:]).sum()
    counts.append((len(pos), int(np.round(trigrams * 0.05))))
  have, want = np.array(counts).T
  assert (have <= want).all() and (have == want).mean() > 0.95 and have.sum() > B // 4  # 5% of the free trigrams

