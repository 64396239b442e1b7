"""On-device MLM masking (token, whole-word, n-gram, span): pure, jittable, a fresh mask from each rng.

Every scheme chooses `n = clip(round(mask_prob * candidates), 1, max_predictions)` tokens per example,
never a special token or padding, and returns static-shape outputs: `max_predictions` gathered
positions whose unused slots carry weight 0. Chosen tokens become [MASK] / a random token / stay as
they are with probabilities (mask_token_prob, random_token_prob, rest): BERT 80/10/10, ELECTRA 85/0/15.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

SCHEMES = ("token", "whole_word", "ngram", "span")


@dataclasses.dataclass(frozen=True)
class MaskingConfig:
  """A masking scheme, its rates, and the vocabulary facts it needs (from the run's tokenizer)."""

  special_ids: tuple  # never masked, never drawn as a random replacement: (pad, unk, cls, sep, mask)
  mask_id: int  # the [MASK] token
  vocab_size: int  # random replacements are drawn from 0..vocab_size-1
  scheme: str = "token"
  mask_prob: float = 0.15
  max_predictions: int = 20
  mask_token_prob: float = 0.8
  random_token_prob: float = 0.1
  max_ngram: int = 3  # ALBERT n-gram masking: n in 1..max_ngram with p(n) proportional to 1/n, shortened to fit
  span_p: float = 0.2  # SpanBERT: span length ~ Geometric(span_p), truncated at max_span words
  max_span: int = 10


def max_predictions(seq_len: int, mask_prob: float) -> int:
  """The number of gathered MLM slots, derived once from seq_len and mask_prob (BERT: 128 -> 20)."""
  return int(math.ceil(seq_len * mask_prob))


def span_length_probs(cfg: MaskingConfig) -> np.ndarray:
  """p(span length = 1..K) in whole words for the scheme (whole_word: always 1)."""
  if cfg.scheme == "ngram":
    p = 1.0 / np.arange(1, cfg.max_ngram + 1)
  elif cfg.scheme == "span":
    n = np.arange(1, cfg.max_span + 1)
    p = cfg.span_p * (1 - cfg.span_p) ** (n - 1)
  else:
    p = np.ones(1)
  return p / p.sum()


def _budget(candidates, cfg):
  count = candidates.sum(-1)
  n = jnp.clip(jnp.round(count * cfg.mask_prob), 1, cfg.max_predictions).astype(jnp.int32)
  return jnp.minimum(n, count)


def _select_tokens(rng, candidates, n, cfg):
  """Token scheme: n candidates uniformly at random. Returns selected [B, S] and the owner of each."""
  scores = jnp.where(candidates, jax.random.uniform(rng, candidates.shape), -1.0)
  rank = jnp.argsort(jnp.argsort(-scores, axis=-1), axis=-1)
  selected = candidates & (rank < n[:, None])
  return selected, jnp.broadcast_to(jnp.arange(candidates.shape[1]), candidates.shape)


def _greedy_spans(unit, n, order, lengths, max_words: int, shorten: bool):
  """Greedy span choice for one example, its random draws given: units (words) are tried in `order`, each
  starting a span of `lengths[u]` (<= max_words) words, cut at the row's last word. A span that overlaps a chosen
  one is skipped. One that would overflow the budget `n` is skipped too, or with `shorten` cut one word at
  a time until it fits, skipped only if its first word alone overflows: ALBERT's n-grams
  (google-research/albert create_pretraining_data.py, create_masked_lm_predictions: `while len(masked_lms)
  + len(index_set) > num_to_predict` takes the next shorter n-gram), which fill a budget that skipping
  would leave short. Returns covered [S] and the start of the span covering each unit (both per unit)."""
  s = unit.shape[0]
  idx = jnp.arange(s)
  counts = jnp.zeros(s, jnp.int32).at[jnp.where(unit >= 0, unit, s)].add(1, mode="drop")
  num_units = (counts > 0).sum()
  cum = jnp.concatenate([jnp.zeros(1, jnp.int32), jnp.cumsum(counts)])
  words = jnp.arange(1, max_words + 1)

  def body(k, carry):
    covered, owner, used = carry
    u = order[k]
    tokens = cum[jnp.minimum(u + words, num_units)] - cum[u]  # tokens of the 1-, 2-, ... word span at u
    # The spans of at most lengths[u] words that fit the budget: a prefix of 1..max_words (tokens only grow).
    longest = ((words <= lengths[u]) & (used + tokens <= n)).sum()
    m = longest if shorten else jnp.where(longest == lengths[u], longest, 0)
    end = jnp.minimum(u + m, num_units)
    in_span = (idx >= u) & (idx < end)
    ok = (u < num_units) & (m > 0) & ~jnp.any(covered & in_span)
    take = ok & in_span
    return covered | take, jnp.where(take, u, owner), used + jnp.where(ok, cum[end] - cum[u], 0)

  init = (jnp.zeros(s, bool), jnp.zeros(s, jnp.int32), jnp.zeros((), jnp.int32))
  covered, owner, _ = jax.lax.fori_loop(0, s, body, init)
  return covered, owner


def _select_spans_one(rng, unit, n, probs, shorten: bool):
  """Spans for one example: a length drawn from `probs` for every word, the words in random order, then
  `_greedy_spans`. Returns the selected tokens and the start word of each token's span."""
  s = unit.shape[0]
  num_units = jnp.max(unit) + 1
  r_len, r_order = jax.random.split(rng)
  lengths = jax.random.choice(r_len, len(probs), (s,), p=jnp.asarray(probs)) + 1
  order = jnp.argsort(jnp.where(jnp.arange(s) < num_units, jax.random.uniform(r_order, (s,)), 2.0))
  covered, owner = _greedy_spans(unit, n, order, lengths, len(probs), shorten)
  safe = jnp.maximum(unit, 0)
  return (unit >= 0) & covered[safe], owner[safe]


def _select_words(rng, candidates, word_start, n, cfg):
  """Whole-word, n-gram and span schemes: spans of whole words over the candidate tokens."""
  # A candidate after a non-candidate (e.g. right after [SEP]) always starts a new word.
  prev = jnp.pad(candidates[:, :-1], ((0, 0), (1, 0)))
  starts = candidates & (word_start | ~prev)
  unit = jnp.where(candidates, jnp.cumsum(starts, axis=-1) - 1, -1)
  rngs = jax.random.split(rng, candidates.shape[0])
  probs = span_length_probs(cfg)
  shorten = cfg.scheme == "ngram"  # ALBERT shortens an n-gram that overflows the budget; the others skip
  return jax.vmap(lambda r, u, k: _select_spans_one(r, u, k, probs, shorten))(rngs, unit, n)


def mask_batch(rng, input_ids, word_start, cfg: MaskingConfig):
  """Masks a batch of token ids [B, S].

  Args:
    rng: fold (seed, step) into it for dynamic masking: a fresh mask every step, reproducible.
    input_ids: int32 [B, S], padding and special tokens included.
    word_start: bool [B, S], True where a token begins a whole word (whole-word/n-gram/span schemes).
    cfg: the scheme, its rates, the ids never masked, [MASK]'s id and the vocabulary size.

  Returns a dict: `input_ids` (corrupted), `mlm_positions` int32 [B, P], `mlm_labels` int32 [B, P]
  (original ids), `mlm_weights` float32 [B, P] (1 for a real prediction, 0 for padding slots).
  """
  if cfg.scheme not in SCHEMES:
    raise ValueError(f"unknown masking scheme {cfg.scheme!r}")
  r_select, r_action, r_random = jax.random.split(rng, 3)
  candidates = ~jnp.isin(input_ids, jnp.asarray(cfg.special_ids, input_ids.dtype))
  n = _budget(candidates, cfg)
  if cfg.scheme == "token":
    selected, owner = _select_tokens(r_select, candidates, n, cfg)
  else:
    selected, owner = _select_words(r_select, candidates, word_start, n, cfg)
  # 80/10/10 per token, or per span for SpanBERT (the whole span gets one action).
  u = jax.random.uniform(r_action, input_ids.shape)
  if cfg.scheme == "span":
    u = jnp.take_along_axis(u, owner, axis=1)
  random_ids = jax.random.randint(r_random, input_ids.shape, 0, cfg.vocab_size, input_ids.dtype)
  random_ids = jnp.where(jnp.isin(random_ids, jnp.asarray(cfg.special_ids, input_ids.dtype)), input_ids, random_ids)
  corrupted = jnp.where(u < cfg.mask_token_prob, cfg.mask_id,
                        jnp.where(u < cfg.mask_token_prob + cfg.random_token_prob, random_ids, input_ids))
  masked_ids = jnp.where(selected, corrupted, input_ids)
  # Gather the selected positions (in order) into max_predictions slots.
  s = input_ids.shape[1]
  key = jnp.where(selected, s - jnp.arange(s), 0)
  top, positions = jax.lax.top_k(key, cfg.max_predictions)
  positions = positions.astype(jnp.int32)
  return dict(
      input_ids=masked_ids,
      mlm_positions=positions,
      mlm_labels=jnp.take_along_axis(input_ids, positions, axis=1),
      mlm_weights=(top > 0).astype(jnp.float32),
  )
