"""The `axial` position kind (`model.position=axial`): the Reformer's factorized position table (transformers'
AxialPositionEmbeddings). Two tables w0 [d1, e1] and w1 [d2, e2] stand for a [d1 x d2, e1 + e2] one: position p
gets cat(w0[p // d2], w1[p % d2]), added to the word embeddings. enwik8's 65,536 positions x 1,024 take
128 x 256 + 512 x 768 = 425,984 parameters instead of 67 million.

transformers trains only at exactly d1 x d2 positions (ValueError otherwise) and evaluates at up to d1 x d2: the
run config's check refuses a training length other than d1 x d2 and packed rows (whose positions restart per
example, which transformers' axial table never sees in training); an input longer than d1 x d2 is refused when the
model is traced. Dropout: transformers drops the word embeddings, then adds the axial table dropped by whole columns
(dropout2d); bertjax drops their sum per element (the same with dropout 0, as the parity tests run).
"""

import jax
import jax.numpy as jnp
from flax import linen as nn

from bertjax.core import config as config_lib
from bertjax.core import sharding as sh
from bertjax.core.config import check
from bertjax.core.errors import UserError
from bertjax.model import kinds
from bertjax.model.positions import PositionKind


@kinds.register("position", "axial")
class Axial(PositionKind):
  """Axial positions: table `axial_0` [d1, e1] and `axial_1` [d2, e2] (module docstring)."""

  hf_family = "reformer"  # transformers has axial positions in its Reformer only

  def check(self, m):
    shape, dims = tuple(m.axial_pos_shape), tuple(m.axial_pos_embds_dim)
    check(len(shape) == 2 and len(dims) == 2 and min(shape + dims) > 0,
          f"model.position=axial needs model.axial_pos_shape (={shape}) and model.axial_pos_embds_dim (={dims}), "
          "two positive numbers each, e.g. (16, 32) and (256, 512)")
    width = m.embedding_size or m.hidden_size
    check(sum(dims) == width, f"model.axial_pos_embds_dim={dims} sums to {sum(dims)}, not the embedding width {width}")

  def check_run(self, config):
    d1, d2 = config.model.axial_pos_shape
    for phase in config_lib.phases(config):
      check(phase.config.seq_len == d1 * d2,
            f"seq_len={phase.config.seq_len}: axial positions train at exactly d1 x d2 = {d1 * d2} positions "
            f"(model.axial_pos_shape={tuple(config.model.axial_pos_shape)}); set seq_len={d1 * d2} or change the shape")
    check(config.data.format != "packed", "data.format=packed restarts positions per example, which axial positions "
          "never see in training (transformers); use data.format=single or full_sentences")

  def table(self, module, c):
    (d1, d2), (e1, e2) = c.axial_pos_shape, c.axial_pos_embds_dim
    return (module.param("axial_0", normal_init(c.axial_norm_std, (None, sh.EMBED)), (d1, e1)),
            module.param("axial_1", normal_init(c.axial_norm_std, (None, sh.EMBED)), (d2, e2)))

  def embed(self, c, table, seq_len, position_ids):
    d1, d2 = c.axial_pos_shape
    if seq_len > d1 * d2:
      raise UserError(f"an input of {seq_len} tokens is longer than the axial positions' d1 x d2 = {d1 * d2} "
                      f"(model.axial_pos_shape={tuple(c.axial_pos_shape)}); shorten it or enlarge the shape")
    p = jnp.arange(seq_len)[None] if position_ids is None else position_ids
    return rows(table, p, d2)


def rows(table, p, d2: int):
  """The axial table's rows at positions p [B, S]: cat(w0[p // d2], w1[p % d2]) [B, S, e1 + e2]."""
  w0, w1 = table
  return jnp.concatenate([jnp.take(w0, p // d2, axis=0), jnp.take(w1, p % d2, axis=0)], axis=-1)


def normal_init(std: float, names):
  """Normal(0, std) with logical axis names (transformers' _init_weights: normal_(weight, std=axial_norm_std))."""
  return nn.with_logical_partitioning(jax.nn.initializers.normal(std), names)
