"""WKLM's entity replacement objective (Xiong, Du, Wang, Stoyanov, ICLR 2020): for every mention, was it the
text's own entity (1) or replaced by another entity of the same type (0)? Sigmoid BCE over the mentions of the
real examples; data preparation made the replacements (bertjax.data.units.corrupt) and marked each mention's
tokens in the row's `mention` array; `mention_slots` gathers their boundaries into static slots on device.

The head reads the encoder's outputs at a mention's first and last token (bertjax.model.heads.WKLMHead).
Metrics: wklm_loss, wklm_accuracy, wklm_replaced_fraction (the share of negatives among the scored mentions).
"""

import jax
import jax.numpy as jnp
import optax

from bertjax.core.metrics import Mean
from bertjax.data.units import MENTION_FIRST, MENTION_INSIDE, MENTION_LAST, MENTION_REPLACED


def slots(config) -> int:
  """Mention slots per example (a static shape): wklm.max_mentions, or seq_len // 4."""
  return int(config.wklm.max_mentions) or config.seq_len // 4


def protected(mention):
  """bool [B, S]: the tokens inside a mention, which MLM never masks (WKLM keeps its masks off mentions)."""
  return (mention & MENTION_INSIDE) > 0


def mention_slots(mention, num_slots: int) -> dict:
  """The first `num_slots` mentions of each row, in order, from the per-token `mention` bits [B, S] (every
  mention whole: data preparation drops the ones truncation cut): `wklm_first`, `wklm_last` int32 [B, E]
  (token positions), `wklm_labels` int32 [B, E] (1: the original mention, 0: replaced), `wklm_weights` float32
  [B, E] (0 for unused slots)."""
  s = mention.shape[1]
  rank = lambda bit: jax.lax.top_k(jnp.where((mention & bit) > 0, s - jnp.arange(s), 0), num_slots)
  top, first = rank(MENTION_FIRST)
  _, last = rank(MENTION_LAST)
  replaced = (jnp.take_along_axis(mention, first, axis=1) & MENTION_REPLACED) > 0
  weights = (top > 0).astype(jnp.float32)
  return dict(wklm_first=first.astype(jnp.int32), wklm_last=last.astype(jnp.int32),
              wklm_labels=(~replaced).astype(jnp.int32), wklm_weights=weights)


def count(batch):
  """Every mention in a slot of a real example is a target."""
  return batch["wklm_weights"].sum()


def loss(outputs, batch):
  logits, w = outputs["wklm_logits"], batch["wklm_weights"]
  y = batch["wklm_labels"].astype(jnp.float32)
  bce = optax.sigmoid_binary_cross_entropy(logits, y)
  n = w.sum()
  pred = (logits > 0).astype(jnp.float32)
  return (bce * w).sum(), {
      "wklm_loss": Mean((bce * w).sum(), n),
      "wklm_accuracy": Mean(((pred == y) * w).sum(), n),
      "wklm_replaced_fraction": Mean(((1 - y) * w).sum(), n),
  }
