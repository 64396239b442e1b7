"""On-device MLM masking (token, whole-word, n-gram, span, ERNIE's units) and StructBERT's trigram shuffling:
pure, jittable, a fresh corruption from each rng.

Every scheme chooses `n = clip(round(mask_prob * candidates), 1, max_predictions)` tokens per example
(SpanBERT's span scheme: ceil; ERNIE's draws per unit: bertjax.objectives.ernie), never a special token or
padding, and returns static-shape outputs:
`max_predictions` gathered positions whose unused slots carry weight 0. Chosen tokens become [MASK] / a
random token / stay as they are with probabilities (mask_token_prob, random_token_prob, rest): BERT
80/10/10, ELECTRA 85/0/15. Each slot also carries the boundaries of its span (the maximal run of masked
tokens around it), which SpanBERT's span-boundary objective predicts from.

Two options draw from the corpus unigram distribution, given to `mask_batch` as a [vocab] vector of token
counts (`token_counts`, an array input: the compiled step does not change with the corpus):
- `replace_dist`: uniform (BERT: random ids uniformly from the vocabulary) | unigram (SpanBERT:
  masking.py's `np.random.choice(tokens)` draws a position of the corpus token stream, i.e. an id with
  probability proportional to its count). Special ids are never drawn in either.
- `smoothing` s (DistilBERT's --mlm_smoothing 0.7; token scheme): a token is chosen with probability
  proportional to max(count, 1)^-s (train.py: token_probs = np.maximum(counts, 1) ** -mlm_smoothing), without
  replacement (Gumbel top-k, the distribution of distiller.py's torch.multinomial(..., replacement=False));
  0 = uniform.

`make_config` turns the run config's masking section (with the tokenizer's special ids) into a MaskingConfig;
`validate` checks that section; `needs_counts` says whether a config needs the corpus token counts.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.core import config as config_lib
from bertjax.core.config import check
from bertjax.objectives import ernie

SCHEMES = ("token", "whole_word", "ngram", "span", "ernie")
REPLACE_DISTS = ("uniform", "unigram")
TRIGRAM = 3  # StructBERT's K: "we randomly choose ... unmasked trigrams" (Wang et al. 2020, §2.2)
# The 3-token permutations other than the identity: a shuffled trigram always changes order (an unshuffled
# one would teach the objective nothing about order).
_PERMUTATIONS = np.array([[0, 2, 1], [1, 0, 2], [1, 2, 0], [2, 0, 1], [2, 1, 0]], np.int32)


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
  shuffle_share: float = 0.0  # StructBERT WSO: share of the unmasked trigrams shuffled (0: no shuffling)
  max_shuffled: int = 0  # WSO slots per example (3 x the most trigrams), from shuffle_slots()
  replace_dist: str = "uniform"  # random replacements: uniform over the vocabulary | unigram (corpus counts)
  smoothing: float = 0.0  # token scheme: choose tokens with probability proportional to count^-smoothing (0: uniform)
  units: bool = False  # word schemes over data.units' units (the batch's unit_start) instead of words

  @property
  def needs_counts(self) -> bool:
    """Whether mask_batch needs the corpus token counts."""
    return self.replace_dist == "unigram" or self.smoothing > 0


def max_predictions(seq_len: int, mask_prob: float) -> int:
  """The number of gathered MLM slots, derived once from seq_len and mask_prob (BERT: 128 -> 20)."""
  return config_lib.mlm_slots(seq_len, mask_prob)


def shuffle_slots(seq_len: int, share: float) -> int:
  """WSO's gathered slots per example: 3 tokens for each of at most ceil(share x seq_len) trigrams."""
  return TRIGRAM * max(1, int(math.ceil(share * seq_len))) if share > 0 else 0


def make_config(config, special, evaluation: bool = False) -> MaskingConfig:
  """The config's masking scheme with the tokenizer's special ids (`special`: a data.tokenizer.SpecialIds);
  `evaluation`: at the eval batches' rate and budget (masking.eval_mask_prob)."""
  k = config.masking
  rate, budget = ((config_lib.eval_mask_prob(config), config_lib.eval_max_predictions(config)) if evaluation
                  else (k.mask_prob, config_lib.max_predictions(config)))
  return MaskingConfig(
      special_ids=special.never_masked, mask_id=special.mask, vocab_size=config.model.vocab_size,
      scheme=k.scheme, mask_prob=rate, max_predictions=budget,
      mask_token_prob=k.mask_token_prob, random_token_prob=k.random_token_prob, max_ngram=k.max_ngram,
      span_p=k.span_p, max_span=k.max_span, replace_dist=k.get("replace_dist", "uniform"),
      smoothing=float(k.get("smoothing", 0.0)), units=bool(k.get("units", False)), **_shuffling(config))


def needs_counts(config) -> bool:
  """Whether the config's masking draws from the corpus token counts (replace_dist unigram, smoothing > 0)."""
  return config.masking.get("replace_dist", "uniform") == "unigram" or config.masking.get("smoothing", 0.0) > 0


def _shuffling(config) -> dict:
  """StructBERT's trigram shuffling, on while the wso objective is."""
  if "wso" not in config_lib.active_objectives(config):
    return dict(shuffle_share=0.0, max_shuffled=0)
  return dict(shuffle_share=config.masking.wso_share,
              max_shuffled=shuffle_slots(config.seq_len, config.masking.wso_share))


def validate(config):
  """Checks config.masking (scheme, rates, and the wso share when the wso objective is on); raises UserError
  with the fix on the first problem."""
  k = config.masking
  check(k.scheme in SCHEMES, f"masking.scheme={k.scheme!r}; use one of {', '.join(SCHEMES)}")
  check(0 < k.mask_prob < 1, f"masking.mask_prob={k.mask_prob} must be in (0, 1)")
  check(0 <= k.get("eval_mask_prob", 0.0) < 1,
        f"masking.eval_mask_prob={k.get('eval_mask_prob')} must be in [0, 1) (0: the training mask_prob)")
  check(k.mask_token_prob + k.random_token_prob <= 1,
        "masking.mask_token_prob + masking.random_token_prob must not exceed 1")
  check("wso" not in config_lib.active_objectives(config) or 0 < k.wso_share < 1,
        f"masking.wso_share={k.wso_share} must be in (0, 1) for the wso objective")
  replace, smoothing = k.get("replace_dist", "uniform"), k.get("smoothing", 0.0)
  check(replace in REPLACE_DISTS, f"masking.replace_dist={replace!r}; use uniform or unigram")
  check(smoothing >= 0, f"masking.smoothing={smoothing} must be >= 0 (0: every token equally likely)")
  check(smoothing == 0 or k.scheme == "token",
        f"masking.smoothing={smoothing} weighs single tokens (DistilBERT); use --config.masking.scheme=token")
  check(not k.get("units", False) or config.data.get("units", ""),
        "masking.units=True masks data.units' entity/phrase units; set --config.data.units=conll:PATH or jsonl:PATH")
  check(not k.get("units", False) or k.scheme != "token",
        "masking.units=True masks whole units; use --config.masking.scheme=ernie or whole_word")


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
  # SpanBERT's sampler takes ceil (facebookresearch/SpanBERT pretraining/fairseq/data/masking.py,
  # PairWithSpanMaskingScheme.mask: mask_num = math.ceil(sent_length * self.mask_ratio)); BERT rounds.
  # (A float32 product a hair above a whole number, 100 x 0.15 = 15.0000006, is that number.)
  rounding = (lambda x: jnp.ceil(x - 1e-4)) if cfg.scheme == "span" else jnp.round
  n = jnp.clip(rounding(count * cfg.mask_prob), 1, cfg.max_predictions).astype(jnp.int32)
  return jnp.minimum(n, count)


def _select_tokens(rng, candidates, n, cfg, log_weights=None):
  """Token scheme: n candidates uniformly at random, or without replacement with probabilities proportional to
  exp(log_weights) [B, S] (Gumbel top-k). Returns selected [B, S] and the owner of each."""
  if log_weights is None:
    scores = jnp.where(candidates, jax.random.uniform(rng, candidates.shape), -1.0)
  else:
    scores = jnp.where(candidates, log_weights + jax.random.gumbel(rng, candidates.shape), -jnp.inf)
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


def _spanbert_one(rng, candidates, starts, unit, n, probs, iterations: int):
  """SpanBERT's span sampler for one example (facebookresearch/SpanBERT pretraining/fairseq/data/masking.py,
  PairWithSpanMaskingScheme.mask), its rejection loop made a fixed loop: until n tokens are masked, draw a
  length L from `probs` (in words) and an anchor token uniformly among the unmasked text tokens (SpanBERT
  redraws both while the anchor is already masked: the same distribution), then mask from the first token
  of the anchor's word through L words, in token order, stopping the moment the budget is reached (so the
  last span may end inside a word, as in SpanBERT). Spans stop at a special token (a row's [SEP]); a span
  may run into tokens that an earlier one masked, and touching spans merge into one. Each iteration masks
  at least the anchor, so `iterations` = max_predictions >= n suffice. Returns selected [S]."""
  s = candidates.shape[0]
  idx = jnp.arange(s)
  word_first = jax.lax.cummax(jnp.where(starts, idx, 0))  # first token of each token's word
  run_end = jnp.flip(jax.lax.cummin(jnp.flip(jnp.where(candidates, s, idx))))  # next special token
  k = len(probs)
  r_len, r_anchor = jax.random.split(rng)
  lengths = jax.random.choice(r_len, k, (iterations,), p=jnp.asarray(probs)) + 1

  def body(i, carry):
    covered, used = carry
    free = candidates & ~covered
    anchor = jnp.argmax(jnp.where(free, jax.random.uniform(jax.random.fold_in(r_anchor, i), (s,)), -1.0))
    in_span = (idx >= word_first[anchor]) & (idx < run_end[anchor]) & (unit < unit[anchor] + lengths[i])
    new = in_span & ~covered & free[anchor]
    take = new & (jnp.cumsum(new) <= n - used)  # nothing once the budget is spent
    return covered | take, used + take.sum()

  covered, _ = jax.lax.fori_loop(0, iterations, body, (jnp.zeros(s, bool), jnp.zeros((), jnp.int32)))
  return covered


def _select_words(rng, candidates, word_start, n, cfg):
  """Whole-word, n-gram and span schemes: spans of whole words over the candidate tokens."""
  # A candidate after a non-candidate (e.g. right after [SEP]) always starts a new word.
  prev = jnp.pad(candidates[:, :-1], ((0, 0), (1, 0)))
  starts = candidates & (word_start | ~prev)
  unit = jnp.where(candidates, jnp.cumsum(starts, axis=-1) - 1, -1)
  rngs = jax.random.split(rng, candidates.shape[0])
  probs = span_length_probs(cfg)
  if cfg.scheme == "span":
    one = lambda r, c, st, u, k: _spanbert_one(r, c, st, u, k, probs, cfg.max_predictions)
    selected = jax.vmap(one)(rngs, candidates, starts, unit, n)
    return selected, _run_starts(selected)  # one action per merged span
  shorten = cfg.scheme == "ngram"  # ALBERT shortens an n-gram that overflows the budget; whole words skip
  return jax.vmap(lambda r, u, k: _select_spans_one(r, u, k, probs, shorten))(rngs, unit, n)


def _run_starts(selected):
  """[B, S]: for a selected token, the first token of the maximal run of selected tokens holding it."""
  idx = jnp.arange(selected.shape[1])
  return jax.lax.cummax(jnp.where(selected, 0, idx + 1), axis=1).clip(0, selected.shape[1] - 1)


def span_boundaries(selected, candidates, positions, weights):
  """The span-boundary targets of the gathered slots: for each slot at `positions` [B, P], `span_left` and
  `span_right`, the positions just outside the maximal run of selected tokens that holds it (SpanBERT
  merges touching spans into one: masking.py, merge_intervals), and `span_weights`, the slot's weight where
  both boundaries are text tokens, else 0: a span that starts right after [CLS] or ends right before [SEP]
  has no SBO target (SpanBERT masks the text without [CLS]/[SEP] and skips spans at its edges: span_masking,
  `if start > lower_limit and end < upper_limit`)."""
  s = selected.shape[1]
  idx = jnp.arange(s)
  left = jax.lax.cummax(jnp.where(selected, -1, idx), axis=1)  # last unselected position at or before
  right = jnp.flip(jax.lax.cummin(jnp.flip(jnp.where(selected, s, idx), 1), axis=1), 1)
  at = lambda x: jnp.take_along_axis(x, positions, axis=1)
  span_left, span_right = at(left).clip(0, s - 1), at(right).clip(0, s - 1)
  text = lambda p: jnp.take_along_axis(candidates, p, axis=1) & ~jnp.take_along_axis(selected, p, axis=1)
  inside = (at(left) >= 0) & (at(right) < s) & text(span_left) & text(span_right)
  return dict(span_left=span_left.astype(jnp.int32), span_right=span_right.astype(jnp.int32),
              span_weights=weights * inside.astype(weights.dtype))


def shuffle_trigrams(rng, input_ids, free, cfg: MaskingConfig):
  """StructBERT's word-structural corruption: `cfg.shuffle_share` of each row's unmasked trigrams (three
  consecutive `free` tokens: text, not chosen by MLM), rounded, at most cfg.max_shuffled // 3, get their
  tokens permuted (never left in order); the objective predicts the original token at each of their
  positions through the MLM head. Trigrams never overlap: they are drawn among aligned slots (every third
  position from a random offset per row) whose three tokens are free.

  Returns `input_ids` (shuffled), `wso_positions` int32 [B, Q], `wso_labels` int32 [B, Q] (the original
  tokens) and `wso_weights` float32 [B, Q] (0 for unused slots), Q = cfg.max_shuffled.
  """
  b, s = input_ids.shape
  most = cfg.max_shuffled // TRIGRAM
  r_offset, r_pick, r_perm = jax.random.split(rng, 3)
  ahead = lambda x, k: jnp.pad(x[:, k:], ((0, 0), (0, k)))
  whole = free & ahead(free, 1) & ahead(free, 2)  # a free trigram starts here
  # "randomly choose 5% of the unmasked trigrams" (StructBERT §2.2): their number, of all such trigrams.
  n = jnp.round(whole.sum(-1) * cfg.shuffle_share).astype(jnp.int32)
  offset = jax.random.randint(r_offset, (b, 1), 0, TRIGRAM)
  slots = offset + TRIGRAM * jnp.arange(-(-s // TRIGRAM))[None]  # [B, J] aligned slot starts
  ok = jnp.take_along_axis(whole, jnp.minimum(slots, s - 1), axis=1) & (slots < s)
  scores = jnp.where(ok, jax.random.uniform(r_pick, slots.shape), -1.0)
  rank = jnp.argsort(jnp.argsort(-scores, axis=-1), axis=-1)
  chosen = ok & (rank < n[:, None])
  key = jnp.where(chosen, slots.shape[1] - jnp.arange(slots.shape[1]), 0)  # chosen slots, in order
  top, which = jax.lax.top_k(key, most)
  starts = jnp.take_along_axis(slots, which, axis=1)
  used = top > 0
  perm = jnp.asarray(_PERMUTATIONS)[jax.random.randint(r_perm, (b, most), 0, len(_PERMUTATIONS))]  # [B, T, 3]
  positions = jnp.where(used[..., None], starts[..., None] + jnp.arange(TRIGRAM), 0).astype(jnp.int32)
  sources = jnp.where(used[..., None], starts[..., None] + perm, 0)
  flat = lambda x: x.reshape(b, most * TRIGRAM)
  labels = jnp.take_along_axis(input_ids, flat(positions), axis=1)
  values = jnp.take_along_axis(input_ids, flat(sources), axis=1)
  weights = flat(jnp.broadcast_to(used[..., None], positions.shape)).astype(jnp.float32)
  # Unused slots write nowhere (an out-of-range index, dropped).
  targets = jnp.where(weights > 0, flat(positions), s)
  shuffled = jax.vmap(lambda ids, t, v: ids.at[t].set(v, mode="drop"))(input_ids, targets, values)
  return dict(input_ids=shuffled, wso_positions=flat(positions), wso_labels=labels, wso_weights=weights)


def _random_ids(rng, input_ids, cfg: MaskingConfig, token_counts):
  """[B, S] replacement ids: uniform over the vocabulary (a special id drawn leaves the token as it was), or
  with replace_dist unigram an id with probability proportional to its corpus count (special ids weigh 0),
  by inverse CDF: a [vocab] cumulative sum and a search per token, never a [B, S, vocab] array."""
  special = jnp.asarray(cfg.special_ids, input_ids.dtype)
  if cfg.replace_dist != "unigram":
    ids = jax.random.randint(rng, input_ids.shape, 0, cfg.vocab_size, input_ids.dtype)
    return jnp.where(jnp.isin(ids, special), input_ids, ids)
  weights = jnp.asarray(token_counts, jnp.float32).at[special].set(0.0)
  cdf = jnp.cumsum(weights)
  u = jax.random.uniform(rng, input_ids.shape) * cdf[-1]
  return jnp.minimum(jnp.searchsorted(cdf, u, side="right"), cfg.vocab_size - 1).astype(input_ids.dtype)


def mask_batch(rng, input_ids, word_start, cfg: MaskingConfig, token_counts=None, protect=None):
  """Masks a batch of token ids [B, S].

  Args:
    rng: fold (seed, step) into it for dynamic masking: a fresh mask every step, reproducible.
    input_ids: int32 [B, S], padding and special tokens included.
    word_start: bool [B, S], True where a token begins a whole word (whole-word/n-gram/span/ernie schemes), or
      with cfg.units where a unit begins (the batch's unit_start).
    cfg: the scheme, its rates, the ids never masked, [MASK]'s id and the vocabulary size.
    token_counts: [vocab] corpus counts of each id, when cfg.needs_counts (replace_dist unigram, smoothing).
    protect: bool [B, S], tokens never masked (WKLM keeps MLM off its mentions), or None.

  Returns a dict: `input_ids` (corrupted), `mlm_positions` int32 [B, P], `mlm_labels` int32 [B, P]
  (original ids), `mlm_weights` float32 [B, P] (1 for a real prediction, 0 for padding slots), the slots'
  span boundaries `span_left`, `span_right`, `span_weights` [B, P] (see `span_boundaries`), and with
  cfg.shuffle_share > 0 StructBERT's shuffled trigrams (`shuffle_trigrams`: `wso_positions`, `wso_labels`,
  `wso_weights`, and the shuffled `input_ids`); the ernie scheme adds `units_masked` and `units_cut` [B].
  """
  if cfg.scheme not in SCHEMES:
    raise ValueError(f"unknown masking scheme {cfg.scheme!r}")
  if cfg.needs_counts and token_counts is None:
    raise ValueError("masking.replace_dist=unigram and masking.smoothing need the corpus token_counts")
  r_select, r_action, r_random = jax.random.split(rng, 3)
  r_shuffle = jax.random.fold_in(rng, 1)  # its own stream: adding WSO leaves the MLM masks as they were
  candidates = ~jnp.isin(input_ids, jnp.asarray(cfg.special_ids, input_ids.dtype))
  if protect is not None:
    candidates = candidates & ~protect
  n = _budget(candidates, cfg)
  u, extra = jax.random.uniform(r_action, input_ids.shape), {}
  if cfg.scheme == "ernie":
    selected, u, masked_units, cut = ernie.mask(r_select, candidates, word_start, cfg.max_predictions, cfg.mask_prob)
    extra = dict(units_masked=masked_units, units_cut=cut)
  elif cfg.scheme == "token":
    log_weights = None
    if cfg.smoothing > 0:  # DistilBERT: p(token) proportional to max(count, 1)^-smoothing
      counts = jnp.maximum(jnp.asarray(token_counts, jnp.float32), 1.0)
      log_weights = -cfg.smoothing * jnp.log(counts)[input_ids]
    selected, owner = _select_tokens(r_select, candidates, n, cfg, log_weights)
  else:
    selected, owner = _select_words(r_select, candidates, word_start, n, cfg)
  # 80/10/10 per token, or per span for SpanBERT (the whole span gets one action).
  if cfg.scheme == "span":
    u = jnp.take_along_axis(u, owner, axis=1)
  out = corrupt_and_gather(input_ids, selected, u, _random_ids(r_random, input_ids, cfg, token_counts), candidates,
                           cfg)
  out.update(extra)
  if cfg.shuffle_share > 0:
    out.update(shuffle_trigrams(r_shuffle, out["input_ids"], candidates & ~selected, cfg))
  return out


def corrupt_and_gather(input_ids, selected, u, random_ids, candidates, cfg: MaskingConfig):
  """The selected tokens corrupted by their action draws `u` [B, S] (below mask_token_prob: [MASK]; below
  mask_token_prob + random_token_prob: `random_ids`; else kept) and gathered, in order, into max_predictions
  slots: `input_ids`, `mlm_positions`, `mlm_labels`, `mlm_weights` and the slots' span boundaries."""
  corrupted = jnp.where(u < cfg.mask_token_prob, cfg.mask_id,
                        jnp.where(u < cfg.mask_token_prob + cfg.random_token_prob, random_ids, input_ids))
  masked_ids = jnp.where(selected, corrupted, input_ids)
  s = input_ids.shape[1]
  key = jnp.where(selected, s - jnp.arange(s), 0)
  top, positions = jax.lax.top_k(key, cfg.max_predictions)
  positions = positions.astype(jnp.int32)
  weights = (top > 0).astype(jnp.float32)
  return dict(
      input_ids=masked_ids,
      mlm_positions=positions,
      mlm_labels=jnp.take_along_axis(input_ids, positions, axis=1),
      mlm_weights=weights,
      **span_boundaries(selected, candidates, positions, weights),
  )
