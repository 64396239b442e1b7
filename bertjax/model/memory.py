"""Segment memory under `jit`: Transformer-XL's memory of each layer's input and the Compressive Transformer's
compressed memory (Rae et al., ICLR 2020, Algorithms 1 and 2), as fixed-size buffers with validity masks.

The state of a model with memory is a dict (`empty` makes the first one):
- `mem` [L, B, M, d] (M = mem_len) and `mem_valid` [B, M] bool: valid rows are right-aligned, the newest last,
  so relative distances equal transformers' growing memory (bertjax.model.relative).
- with cmem_len C > 0, `cmem` [L, B, C, d] and `cmem_valid` [B, C]: the compressed memory, oldest first; keys
  are [cmem; mem; input].
Each segment pushes the first `reuse_len` rows (all rows when 0) of every layer's input (transformers'
cache_mem: the input of layer i, so embeddings .. the output of layer L-2). The rows pushed out of the oldest
end of `mem` are compressed by `cmem_fn` at `cmem_rate` c and pushed into `cmem`. A compression function
learns only from the attention-reconstruction loss (Algorithm 2): layer input, evicted rows and the layer's
attention weights under stop-gradient, and the stored `cmem` is a constant at the next segment.

The paper zero-initialises both memories and attends to the zeros; `MemoryConfig.zeros_visible` keeps that
behaviour (every slot valid from the start). By default unfilled slots are masked, as transformers starts
with no memory.
"""

import dataclasses

import jax
import jax.numpy as jnp
from flax import linen as nn

from bertjax.core import sharding as sh
from bertjax.core.config import check

CMEM_FNS = ("mean", "max", "conv", "dilated_conv", "most_used")
ATTN_TYPES = ("bi", "uni")


@dataclasses.dataclass(frozen=True)
class MemoryConfig:
  """XLNet's relative-attention and memory options (config.model.xlnet; configs/xlnet.py says each one)."""

  mem_len: int = 0  # M: memory slots per layer (0: no memory)
  reuse_len: int = 0  # rows of each segment pushed into memory (0: all of them)
  clamp_len: int = -1  # relative distances clamped to +-clamp_len (<= 0: no clamp)
  bi_data: bool = False  # the second half of the batch reads reversed streams: negated distances
  attn_type: str = "bi"  # bi (bidirectional) | uni (causal over memory + input)
  cmem_len: int = 0  # C: compressed memory slots per layer (0: no compressed memory)
  cmem_rate: int = 1  # c: evicted rows per compressed row
  cmem_fn: str = "mean"  # mean | max | conv | dilated_conv | most_used
  zeros_visible: bool = False  # the paper's Algorithm 1: zero-initialised slots are attended to

  def push_rows(self, qlen: int) -> int:
    """Rows each segment pushes into memory (reuse_len, or the whole segment)."""
    return self.reuse_len or qlen

  @property
  def slots(self) -> int:
    """Memory keys every query sees before its own segment: C + M."""
    return self.cmem_len + self.mem_len


def section(**values) -> dict:
  """A config.model.xlnet section: MemoryConfig's defaults with `values` (configs/xlnet.py, HF import)."""
  return dataclasses.asdict(MemoryConfig(**values))


def memory_config(x) -> MemoryConfig:
  """The MemoryConfig of a config.model.xlnet section (absent keys keep their defaults)."""
  keys = {f.name for f in dataclasses.fields(MemoryConfig)}
  return MemoryConfig(**{k: v for k, v in dict(x).items() if k in keys})


def validate(x, seq_len: int | None = None) -> None:
  """Checks config.model.xlnet (against the run's seq_len where given); raises UserError naming the key."""
  check(x.attn_type in ATTN_TYPES, f"model.xlnet.attn_type={x.attn_type!r}; use bi or uni")
  check(x.mem_len >= 0 and x.cmem_len >= 0, "model.xlnet.mem_len and cmem_len count slots: use 0 or more")
  check(x.reuse_len >= 0 and (seq_len is None or x.reuse_len <= seq_len),
        f"model.xlnet.reuse_len={x.reuse_len} must be in [0, seq_len={seq_len}]")
  check(x.cmem_fn in CMEM_FNS, f"model.xlnet.cmem_fn={x.cmem_fn!r}; use one of {', '.join(CMEM_FNS)}")
  if x.cmem_len:
    rows = x.reuse_len or seq_len
    check(x.mem_len > 0, f"model.xlnet.cmem_len={x.cmem_len} compresses rows evicted from memory: set mem_len > 0")
    check(x.cmem_rate >= 1 and (rows or 0) % x.cmem_rate == 0 and x.mem_len % x.cmem_rate == 0,
          f"model.xlnet.cmem_rate={x.cmem_rate} must divide the rows pushed per segment ({rows}: reuse_len or "
          f"seq_len) and mem_len={x.mem_len}, so that evicted rows compress whole")


def empty(num_layers: int, batch: int, d_model: int, mc: MemoryConfig, dtype=jnp.float32) -> dict | None:
  """The memory state before the first segment (None without memory): zero rows, none valid unless
  zeros_visible."""
  if not mc.mem_len:
    return None
  state = dict(mem=jnp.zeros((num_layers, batch, mc.mem_len, d_model), dtype),
               mem_valid=jnp.full((batch, mc.mem_len), mc.zeros_visible))
  if mc.cmem_len:
    state.update(cmem=jnp.zeros((num_layers, batch, mc.cmem_len, d_model), dtype),
                 cmem_valid=jnp.full((batch, mc.cmem_len), mc.zeros_visible))
  return state


def logical_axes(state: dict) -> dict:
  """The logical axis names of each array of a memory state (bertjax.core.sharding): batch-sharded like the
  batch, for a training state that carries memory between steps."""
  names = {"mem": (None, sh.BATCH, None, sh.ACT_EMBED), "cmem": (None, sh.BATCH, None, sh.ACT_EMBED),
           "mem_valid": (sh.BATCH, None), "cmem_valid": (sh.BATCH, None)}
  return {k: names[k] for k in state}


def fifo(buffer, rows):
  """Pushes `rows` [B, R, ...] into the oldest-first `buffer` [B, M, ...]: (the last M rows of both, the
  first R rows, which fall out)."""
  both = jnp.concatenate([buffer, rows], axis=1)
  return both[:, -buffer.shape[1]:], both[:, :rows.shape[1]]


def key_valid(state, batch: int, mc: MemoryConfig):
  """[B, C + M] whether each memory key holds a row (compressed slots first)."""
  if state is None:
    return jnp.zeros((batch, 0), bool)
  parts = ([state["cmem_valid"]] if mc.cmem_len else []) + [state["mem_valid"]]
  return jnp.concatenate(parts, axis=1)


def next_validity(state, rows: int, mc: MemoryConfig) -> dict:
  """The validity masks after a segment pushes `rows` rows, the same for every layer: `mem_valid`, and with
  compressed memory `evicted` [B, rows] (of the rows that fall out of `mem`), `compressed` [B, rows / c] (of their
  compression) and `cmem_valid`. The evicted rows' validity is a suffix whose length divides by c (validate), so
  a compressed row is valid exactly when its c evicted rows are (most_used keeps the valid rows first: they
  have the attention, the rest has 0)."""
  b = state["mem_valid"].shape[0]
  mem_valid, evicted = fifo(state["mem_valid"], jnp.ones((b, rows), bool))
  out = dict(mem_valid=mem_valid)
  if mc.cmem_len:
    k = rows // mc.cmem_rate
    n = jnp.sum(evicted, axis=1) // mc.cmem_rate
    if mc.cmem_fn == "most_used":
      n = jnp.minimum(jnp.sum(evicted, axis=1), k)
    compressed = jnp.arange(k)[None, :] >= k - n[:, None]
    out.update(evicted=evicted, compressed=compressed, cmem_valid=fifo(state["cmem_valid"], compressed)[0])
  return out


def most_used(rows, scores, k: int):
  """The k rows [B, k, d] of `rows` [B, R, d] with the highest `scores` [B, R] (mean attention they received),
  kept in their original order."""
  _, idx = jax.lax.top_k(scores, k)
  idx = jnp.sort(idx, axis=1)
  return jnp.take_along_axis(rows, idx[:, :, None], axis=1)


class Compress(nn.Module):
  """f_c: evicted rows [B, R, d] -> compressed rows [B, R / c, d] (max/mean pooling, a convolution of kernel and
  stride c, a dilated one, or the most-used rows). `scores` [B, R]: the attention each row received (most_used)."""

  mc: MemoryConfig
  d_model: int
  init_std: float = 0.02

  @nn.compact
  def __call__(self, rows, scores=None):
    c, fn = self.mc.cmem_rate, self.mc.cmem_fn
    b, r, d = rows.shape
    if fn in ("mean", "max"):
      windows = rows.reshape(b, r // c, c, d)
      return windows.mean(2) if fn == "mean" else windows.max(2)
    if fn == "most_used":
      return most_used(rows, scores, r // c)
    init = nn.with_logical_partitioning(nn.initializers.normal(self.init_std), (None, sh.EMBED, None))
    kernel = self.param("kernel", init, (c, d, d))  # [k, in, out]: torch Conv1d's [out, in, k] transposed
    bias = self.param("bias", nn.with_logical_partitioning(nn.initializers.zeros_init(), (None,)), (d,))
    # Dilated: kernel c with dilation 2 reaches 2c - 1 rows, left-padded by c - 1 so the output has R / c rows
    # (the paper names dilated convolutions without their shape; this is our reading).
    dilation, pad = (2, c - 1) if fn == "dilated_conv" else (1, 0)
    y = jax.lax.conv_general_dilated(rows, kernel.astype(rows.dtype), (c,), [(pad, 0)], rhs_dilation=(dilation,),
                                     dimension_numbers=("NWC", "WIO", "NWC"))
    return y + bias.astype(rows.dtype)


def attention(h, rows, valid, wq, wk, wv):
  """Content-only multi-head attention of queries h [B, S, d] over rows [B, R, d] (Algorithm 2's attn(h, m) =
  softmax((hQ)(mK)^T)(mV), scaled by d_head^-0.5 as the public implementations do), with invalid rows masked;
  a query with no valid row gets zeros. Returns [B, S, N, D]."""
  q, k, v = (jnp.einsum("bsd,dnh->bsnh", x, w) for x, w in ((h, wq), (rows, wk), (rows, wv)))
  scores = jnp.einsum("bsnh,brnh->bnsr", q, k, preferred_element_type=jnp.float32) * q.shape[-1] ** -0.5
  scores = jnp.where(valid[:, None, None, :], scores, -jnp.inf)
  any_valid = jnp.any(valid, axis=1)[:, None, None, None]
  probs = jnp.where(any_valid, jax.nn.softmax(jnp.where(any_valid, scores, 0.0), axis=-1), 0.0)
  return jnp.einsum("bnsr,brnh->bsnh", probs, v.astype(jnp.float32))


def reconstruction_loss(h, evicted, evicted_valid, compressed, compressed_valid, wq, wk, wv):
  """Algorithm 2's attention-reconstruction loss of one layer: the mean squared difference of attending from
  the layer input to the evicted rows and to their compression. The layer input, the evicted rows and the
  attention weights are under stop-gradient, so only the compression function learns from it."""
  sg = jax.lax.stop_gradient
  h, evicted, wq, wk, wv = (sg(x).astype(jnp.float32) for x in (h, evicted, wq, wk, wv))
  full = attention(h, evicted, evicted_valid, wq, wk, wv)
  approx = attention(h, compressed.astype(jnp.float32), compressed_valid, wq, wk, wv)
  return jnp.mean(jnp.square(full - approx))
