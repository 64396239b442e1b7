"""ERNIE 1.0's unit masking (Sun et al. 2019; PaddlePaddle/ERNIE ernie/batching.py `mask()`, commit 830e2b7),
on device with static shapes: `masking.scheme=ernie`.

ERNIE walks the tokens; at the first token of a unit (a word, or with data.units a whole entity or phrase) it
draws p ~ U(0, 1) and selects the unit iff p <= 0.15. The first token reuses p: (0.03, 0.15] -> [MASK],
(0.015, 0.03] -> a random id, else kept; every other token of the unit draws a fresh p: (0.2, 1] -> [MASK],
(0.1, 0.2] -> random, else kept. So 80/10/10 per token, and every token of a selected unit is predicted.
Here the rates are the config's (mask_prob, mask_token_prob, random_token_prob) in those roles.

One difference is forced by the static shapes: ERNIE predicts as many tokens as it selects, bertjax gathers
`max_predictions` slots. Selected units are kept in the order of their draws (a random order) while their
tokens fit the slots; the rest are cut and counted (`units_cut`, which the MLM objective reports beside
`units_masked`). configs/ernie.py sets the slots above the expected count so that few are cut.
"""

import jax
import jax.numpy as jnp


def unit_starts(candidates, boundaries):
  """[B, S]: True at the first token of every unit among the candidate tokens (a candidate after a
  non-candidate, e.g. right after [SEP], always starts one)."""
  prev = jnp.pad(candidates[:, :-1], ((0, 0), (1, 0)))
  return candidates & (boundaries | ~prev)


def select(p, candidates, boundaries, budget: int, mask_prob: float):
  """ERNIE's selection from given draws.

  Args:
    p: float [B, S], one U(0, 1) draw per token: at a unit's first token the unit's draw, elsewhere the
      token's own fresh draw (the layout of ERNIE's loop).
    candidates: bool [B, S], the tokens that may be masked (not special, not padding, not protected).
    boundaries: bool [B, S], True where a unit (word or span) begins.
    budget: the most tokens predicted per example (max_predictions).
    mask_prob: ERNIE's 0.15.

  Returns (selected [B, S], u [B, S], units_masked [B], units_cut [B]): `u` is the action draw in bertjax's
  convention (u < mask_token_prob: [MASK]; below mask_token_prob + random_token_prob: random; else kept):
  ERNIE's t (p / mask_prob at a first token, p elsewhere; [MASK] when t > 1 - mask_token_prob) as u = 1 - t.
  """
  b, s = p.shape
  idx = jnp.arange(s)
  starts = unit_starts(candidates, boundaries)
  first = jax.lax.cummax(jnp.where(starts, idx, 0), axis=1)  # each token's unit's first token
  unit_p = jnp.take_along_axis(p, first, axis=1)
  chosen = candidates & (unit_p <= mask_prob)
  # The budget: chosen units in the order of their draws (ties: position), kept while their tokens fit.
  order = jnp.argsort(jnp.where(chosen, unit_p, 2.0), axis=1, stable=True)
  in_order = jnp.take_along_axis(chosen, order, axis=1)
  used = jnp.cumsum(in_order, axis=1)  # tokens taken up to and including each (sorted) token
  rows = jnp.arange(b)[:, None]
  used_at = jnp.zeros((b, s), jnp.int32).at[rows, order].set(used)
  unit_used = jnp.zeros((b, s), jnp.int32).at[rows, first].max(jnp.where(chosen, used_at, 0))
  selected = chosen & (jnp.take_along_axis(unit_used, first, axis=1) <= budget)
  t = jnp.where(starts, p / mask_prob, p)
  count = lambda x: (x & starts).sum(-1).astype(jnp.float32)
  return selected, 1.0 - t, count(selected), count(chosen & ~selected)


def mask(rng, candidates, boundaries, budget: int, mask_prob: float):
  """`select` with fresh uniform draws from `rng`."""
  return select(jax.random.uniform(rng, candidates.shape), candidates, boundaries, budget, mask_prob)
