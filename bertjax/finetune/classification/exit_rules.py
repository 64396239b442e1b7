"""Early-exit inference rules (DeeBERT's entropy, PABEE's patience, FastBERT's normalized uncertainty, the
depth classifier's halting) as pure functions, and the FLOPs an exit saves.

Every rule is decided per example, layer by layer: `qualifies(rule, threshold, carry, logits, j, depth)` says
which examples may stop after layer j (0-based) given that layer's exit logits [B, C], with a small carry
(PABEE's counter). `exit_layers` runs it over the logits of every layer (the path that computes every layer);
bertjax.finetune.classification.early_exit's while_loop runs the same function one layer at a time, so both
paths give the same answers. The last layer always exits. PABEE's reference code checks its counter with
`torch.all` over the batch (so its runs use eval batch size 1); here each example exits on its own.
"""

import math

import jax.numpy as jnp
import numpy as np

# method -> its rule and the rule's default threshold (the bigger the threshold, the earlier the exit, except
# for patience, where it is the number of agreeing layers: t in 3..8 in PABEE's paper for 12 layers).
RULES = {"deebert": "entropy", "pabee": "patience", "fastbert": "uncertainty", "depth": "depth"}
DEFAULT_THRESHOLD = {"entropy": 0.3, "patience": 3.0, "uncertainty": 0.5, "depth": 0.5}


def entropy(logits):
  """DeeBERT's H(softmax z) = -sum p ln p over the last axis (natural log)."""
  z = logits - jnp.max(logits, -1, keepdims=True)
  logp = z - jnp.log(jnp.sum(jnp.exp(z), -1, keepdims=True))
  return -jnp.sum(jnp.exp(logp) * logp, -1)


def uncertainty(logits):
  """FastBERT's normalized entropy H(p) / ln N (N classes): 1 for a uniform p."""
  return entropy(logits) / math.log(logits.shape[-1])


def start(batch: int):
  """The carry before the first layer: PABEE's previous prediction (none yet) and its counter."""
  return jnp.full((batch,), -1, jnp.int32), jnp.full((batch,), jnp.nan, jnp.float32), jnp.zeros((batch,), jnp.int32)


def qualifies(rule: str, threshold: float, carry, logits, j, depth=None, delta: float = 0.1):
  """(carry, ok [B]): whether each example may exit after layer `j` (0-based), from that layer's logits [B, C].

  entropy      DeeBERT: H(softmax z_j) < threshold (S).
  uncertainty  FastBERT: H(p_j) / ln N < threshold (`speed`).
  patience     PABEE: a counter goes +1 when argmax z_j = argmax z_{j-1}, else back to 0; exit when it reaches
               threshold (t). A single output (regression) counts |z_j - z_{j-1}| < `delta` as agreeing.
  depth        the depth classifier: exit at the first layer where the cumulative q(n <= j + 1 | x) >= threshold;
               `depth` [B, L] is q's logits (read after the first layer).
  """
  prev_label, prev_value, count = carry
  if rule == "entropy":
    return carry, entropy(logits) < threshold
  if rule == "uncertainty":
    return carry, uncertainty(logits) < threshold
  if rule == "depth":
    q = jnp.exp(depth - jnp.max(depth, -1, keepdims=True))
    cdf = jnp.cumsum(q / jnp.sum(q, -1, keepdims=True), -1)
    return carry, jnp.take(cdf, j, axis=-1) >= threshold
  if rule != "patience":
    raise ValueError(f"unknown exit rule {rule!r}")
  if logits.shape[-1] == 1:
    value, label = logits[:, 0].astype(jnp.float32), prev_label
    same = jnp.abs(value - prev_value) < delta  # NaN (no previous layer) compares False
  else:
    value, label = prev_value, jnp.argmax(logits, -1).astype(jnp.int32)
    same = label == prev_label
  count = jnp.where(same, count + 1, 0)
  return (label, value, count), count >= threshold


def exit_layers(rule: str, threshold: float, logits, depth=None, delta: float = 0.1):
  """(exit layer [N] counting from 1, the logits at that exit [N, C]) from every layer's logits [N, L, C]:
  the first layer whose rule qualifies, else the last."""
  logits = jnp.asarray(logits)
  n, num_layers = logits.shape[:2]
  carry, done = start(n), jnp.zeros((n,), bool)
  layer, chosen = jnp.full((n,), num_layers, jnp.int32), logits[:, -1]
  for j in range(num_layers - 1):
    carry, ok = qualifies(rule, threshold, carry, logits[:, j], j, depth, delta)
    new = ok & ~done
    layer = jnp.where(new, j + 1, layer)
    chosen = jnp.where(new[:, None], logits[:, j], chosen)
    done = done | ok
  return np.asarray(layer), np.asarray(chosen)


def layer_flops(n, hidden: int, intermediate: int):
  """FLOPs (2 per multiply-add) of one encoder layer over n tokens: Q, K, V, output projections and the FFN
  (2n(4H^2 + 2HF)), attention scores and their weighted sum (4n^2 H)."""
  n = np.asarray(n, np.float64)
  return 2 * n * (4 * hidden ** 2 + 2 * hidden * intermediate) + 4 * n ** 2 * hidden


def head_flops(method: str, n, hidden: int, outputs: int, width: int = 128):
  """FLOPs of one exit head over n tokens: a pooler and a classifier (DeeBERT, PABEE, depth), or FastBERT's
  student (H -> 128 over all tokens, 2-head attention for [CLS], 128 -> 128, 128 -> outputs)."""
  n = np.asarray(n, np.float64)
  if method == "fastbert":
    return 2 * n * hidden * width + 4 * n * width * width + 6 * width * width + 4 * n * width + 2 * width * outputs
  return 2.0 * (hidden * hidden + hidden * outputs) + 0 * n


def flops_saved(method: str, exit_layer, lengths, hidden: int, intermediate: int, num_layers: int, outputs: int):
  """(share of the full model's FLOPs saved over the examples, FLOPs saved per example) when example i stops
  after exit_layer[i] layers, each with its exit head, against all layers and one head. Embeddings are left out
  (the same for both); the depth classifier's one H x L matmul is counted."""
  per_layer = layer_flops(lengths, hidden, intermediate)
  head = head_flops(method, lengths, hidden, outputs)
  full = num_layers * per_layer + head
  spent = np.asarray(exit_layer) * (per_layer + head) + (2.0 * hidden * num_layers if method == "depth" else 0.0)
  return float(1 - spent.sum() / full.sum()), float((full - spent).mean())
