"""MobileBERT's trigram input (model.trigram_input): each token's word embedding concatenated with its
neighbours', in the order [next, current, previous] (transformers' MobileBertEmbeddings; google-research
mobilebert modeling.py), 3E wide, which the embeddings then project to H.

A neighbour outside the row is zero, as in both references. A neighbour of another packed example (both tokens
in nonzero, different groups) is zero too, so packed examples never see each other; padding (group 0) is a
neighbour like any token, as the references see the [PAD] after an example's last token.
"""

import jax.numpy as jnp


def neighbours_kept(groups, shift: int):
  """[B, S, 1] bool: whether the token `shift` positions away (+1 next, -1 previous) is inside the row and not
  in another packed example. `groups` [B, S] (0 padding, else the example id) or None (one example a row)."""
  s = groups.shape[1]
  inside = (jnp.arange(s) + shift >= 0) & (jnp.arange(s) + shift < s)
  other = jnp.roll(groups, -shift, axis=1)
  same = (other == groups) | (other == 0) | (groups == 0)
  return (inside[None] & same)[..., None]


def trigram(x, groups=None):
  """x [B, S, E] word embeddings -> [B, S, 3E]: [next, current, previous] per token (see the module)."""
  if groups is None:
    groups = jnp.ones(x.shape[:2], jnp.int32)
  nxt = jnp.where(neighbours_kept(groups, 1), jnp.roll(x, -1, axis=1), 0).astype(x.dtype)
  prev = jnp.where(neighbours_kept(groups, -1), jnp.roll(x, 1, axis=1), 0).astype(x.dtype)
  return jnp.concatenate([nxt, x, prev], axis=-1)
