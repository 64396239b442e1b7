"""XLNet's permutation language modeling (Yang et al. 2019): the mean cross-entropy over the predicted positions,
and the inputs that say what each position may see, built on device from the batch's per-token ranks.

A row carries `plm_masked` (the span-sampled targets, bertjax.data.plm.sample_mask) and `perm_rank` (each half's
factorization order, bertjax.data.plm.local_perm); `inputs` turns them into the [B, S, S] `perm_mask` and the
[B, P, S] `target_mapping` as the reference's `_local_perm` and parser do (zihangdai/xlnet data_utils.py:579-720),
so nothing of size S x S is stored or sent from the host:
- positions that are neither targets nor <sep>/<cls> ("non-masked") get rank -1: every position sees them, they
  see no target and no <sep>/<cls>;
- a target sees the positions of its half ranked before it, never itself; <sep>/<cls> see those ranked up to
  themselves (their own included);
- the reuse half sees nothing of the other half, which sees all of the reuse half.
`perm_mask[b, i, j] = 1`: position i may not attend to j (transformers' XLNetLMHeadModel convention).
The targets are the tokens themselves, the first `num_predict` in position order; a sampled <sep>/<cls> is no
target, so some rows have fewer (padding slots weigh 0).
"""

import dataclasses

import jax
import jax.numpy as jnp

from bertjax.core.metrics import Mean
from bertjax.data import plm as data_plm
from bertjax.objectives.common import softmax_xent


@dataclasses.dataclass(frozen=True)
class PLMConfig:
  """What the on-device PLM inputs need: the halves' split, the prediction slots and the function tokens."""

  reuse_len: int
  num_predict: int
  sep: int
  cls: int


def make_config(config, special) -> PLMConfig:
  """The PLM inputs' config of a run config (its reuse part and targets per row, bertjax.data.plm) and its
  tokenizer's ids."""
  return PLMConfig(data_plm.reuse_len(config), data_plm.num_predict(config), special.sep, special.cls)


def perm_mask(input_ids, masked, rank, cfg: PLMConfig):
  """float32 [B, S, S], 1 where query i may not attend to key j, from the targets and ranks (module docstring)."""
  s = input_ids.shape[1]
  func = (input_ids == cfg.sep) | (input_ids == cfg.cls)
  non_mask = ~masked & ~func
  masked_or_func = ~non_mask
  rev = jnp.where(non_mask, -1, rank)
  target = masked_or_func & ~func
  self_rev = jnp.where(target, rev, rev + 1)
  second = jnp.arange(s) >= cfg.reuse_len
  same_half = second[:, None] == second[None, :]
  within = same_half & (self_rev[:, :, None] <= rev[:, None, :]) & masked_or_func[:, None, :]
  reuse_row_other_half = ~second[:, None] & second[None, :]
  return (within | reuse_row_other_half).astype(jnp.float32)


def targets(input_ids, masked, cfg: PLMConfig) -> dict:
  """The prediction slots: `plm_positions` int32 [B, P] (the first num_predict targets in position order),
  `target_mapping` float32 [B, P, S] (one-hot rows, zero for unused slots), `plm_labels` int32 [B, P] (the tokens
  themselves) and `plm_weights` float32 [B, P]."""
  s = input_ids.shape[1]
  target = masked & (input_ids != cfg.sep) & (input_ids != cfg.cls)
  top, positions = jax.lax.top_k(jnp.where(target, s - jnp.arange(s), 0), cfg.num_predict)
  weights = (top > 0).astype(jnp.float32)
  return dict(plm_positions=positions.astype(jnp.int32),
              target_mapping=jax.nn.one_hot(positions, s, dtype=jnp.float32) * weights[..., None],
              plm_labels=jnp.take_along_axis(input_ids, positions, axis=1), plm_weights=weights)


def inputs(batch, cfg: PLMConfig) -> dict:
  """perm_mask, target_mapping and the targets of a batch (its `input_ids`, `plm_masked`, `perm_rank`), padded
  eval rows (example_weight 0) weighing 0."""
  out = targets(batch["input_ids"], batch["plm_masked"], cfg)
  out["plm_weights"] = out["plm_weights"] * batch["example_weight"][:, None]
  out["perm_mask"] = perm_mask(batch["input_ids"], batch["plm_masked"], batch["perm_rank"], cfg)
  return out


def count(batch):
  """Every used prediction slot of a real row is a target."""
  return batch["plm_weights"].sum()


def loss(outputs, batch):
  """Cross-entropy of the LM head's `logits` [B, P, V] (at target_mapping's slots) at the targets (its sum;
  plm_loss is the mean)."""
  loss_sum, n, correct = softmax_xent(outputs["logits"], batch["plm_labels"], batch["plm_weights"])
  return loss_sum, {"plm_loss": Mean(loss_sum, n), "plm_accuracy": Mean(correct, n)}
