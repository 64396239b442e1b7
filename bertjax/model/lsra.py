"""The `lsra` attention kind: the Lite Transformer's long-short range attention (Wu, Liu, Lin, Lin, Han, ICLR 2020;
code: mit-han-lab/lite-transformer, fairseq/modules/multibranch.py and the light/dynamic convolutions).

A layer's attention input is cut along its channels, with no projection before the cut: the first half goes
through multi-head attention at half width (bertjax.model.mha's own computation, `multi_head`: the global
context), the second half through a convolution along the sequence (the local context), and the two outputs are
concatenated before the layer's residual and norm. The convolution branch: Linear (d_c -> d_c, or d_c -> 2 d_c
and a GLU), a depthwise convolution whose H heads are contiguous blocks of d_c / H channels, each head's kernel
softmax-normalized over its K taps and dropped out as DropConnect, then Linear (d_c -> d_c). The kernel is a
parameter [H, K] (`lightweight`) or predicted per position from the branch's input (`dynamic`: a Linear to H x K,
no bias). Taps are not flipped: y[t] = sum_k w[k] u[t + k - P], P = (K - 1) // 2, zero beyond the row's ends.

Unlike the reference, which zeroes the padding's input (its Linear's bias still reaches the neighbours), a tap
here reads only positions of its own example (`groups`: 0 = padding, one id per packed example), so packed
examples are computed as if alone. Kernel sizes may differ per layer (the reference's 3, 7, 15, 31, ...): the
layer scan stacks parameters of one shape, so every layer holds the largest kernel's taps and uses the centred
ones of its own size (the others get probability 0 and no gradient).
"""

import dataclasses

import jax
import jax.numpy as jnp
from flax import linen as nn

from bertjax.core import sharding as sh
from bertjax.core.config import check
from bertjax.model import kinds, mha
from bertjax.model.dropout import token_dropout
from bertjax.model.layers import Block, dense, kernel_init

CONVS = ("lightweight", "dynamic")
# The reference's encoder kernels (transformer_multibranch_v2.base_architecture: 3, 7, 15, 31, 31, 31 for its six
# layers; its argument's default list goes on with 31).
DEFAULT_KERNELS = (3, 7, 15)
DEFAULT_KERNEL = 31
# Rows up to this long run the convolution as band matrices, longer ones unfolded (the reference's DynamicConv1dTBC
# rule: `unfold = T > 512`); the two give the same output.
BAND_MAX_LEN = 512


def kernel_sizes(c) -> tuple:
  """Each layer's kernel size: EncoderConfig.lsra_kernel_sizes (one value: every layer's), or the reference's
  3, 7, 15, then 31."""
  sizes = tuple(c.lsra_kernel_sizes)
  if not sizes:
    sizes = (DEFAULT_KERNELS + (DEFAULT_KERNEL,) * c.num_layers)[:c.num_layers]
  return sizes * c.num_layers if len(sizes) == 1 else sizes


def parse_kernel_sizes(text: str) -> tuple:
  """model.lsra_kernel_sizes ("3,7,15" or "" for the reference's schedule) as a tuple of ints."""
  return tuple(int(k) for k in str(text).replace(" ", "").split(",") if k)


def branch_config(c):
  """The EncoderConfig the attention half sees: half the width, the same heads, the xla implementation (the
  fused kernels are refused for lsra)."""
  return dataclasses.replace(c, hidden_size=c.hidden_size // 2, head_size=0, attention="xla")


def unfold(x, taps: int, pad: int, fill=0):
  """x [B, S, ...] -> [B, S, ..., taps]: window k of position t is x[t + k - pad], `fill` beyond the row."""
  s = x.shape[1]
  widths = [(0, 0)] * x.ndim
  widths[1] = (pad, taps - 1 - pad)
  padded = jnp.pad(x, widths, constant_values=fill)
  return jnp.stack([padded[:, k:k + s] for k in range(taps)], axis=-1)


def conv_unfolded(u, w, groups, pad: int):
  """The head-wise convolution by unfolding the input: y[b, t, c] = sum_k w[b, t, h(c), k] u[b, t + k - pad, c],
  h(c) = c // (C / H), over the taps whose position is in t's group. u [B, S, C], w [B, S, H, K] (normalized
  kernels), groups [B, S]."""
  b, s, ch = u.shape
  heads, taps = w.shape[2:]
  same = unfold(groups, taps, pad) == groups[:, :, None]  # [B, S, K]; 0 fill: never a real example's id
  w = jnp.where((same & (groups[:, :, None] > 0))[:, :, None], w, 0).astype(u.dtype)
  windows = unfold(u, taps, pad).reshape(b, s, heads, ch // heads, taps)
  return jnp.einsum("bshrk,bshk->bshr", windows, w).reshape(b, s, ch)


def band_matrices(w, pad: int):
  """w [..., T, K] (each step's taps) -> [..., T, T] with band[t, s] = w[t, s - t + pad] where 0 <= s - t + pad < K,
  else 0: the reference's strided copy of the taps into [T, T + K - 1] rows, done by padding each step's taps with
  T zeros and reading the flat array in rows one shorter (reshapes and slices: no gather, a cheap gradient)."""
  *lead, t, k = w.shape
  flat = jnp.pad(w, [(0, 0)] * len(lead) + [(0, 0), (0, t)]).reshape(*lead, t * (t + k))
  return flat[..., :t * (t + k - 1)].reshape(*lead, t, t + k - 1)[..., pad:pad + t]


def conv_band(u, w, groups, pad: int):
  """The same convolution as band matrices, one [S, S] per row and head (the reference's `_forward_expanded`),
  with the entries outside t's group zeroed."""
  b, s, ch = u.shape
  heads = w.shape[2]
  band = band_matrices(jnp.moveaxis(w, 2, 1), pad)  # [B, H, T, S]
  allowed = (groups[:, :, None] == groups[:, None, :]) & (groups[:, None, :] > 0)  # [B, T, S]
  band = jnp.where(allowed[:, None], band, 0).astype(u.dtype)
  return jnp.einsum("bhts,bshr->bthr", band, u.reshape(b, s, heads, ch // heads)).reshape(b, s, ch)


def convolve(u, w, groups, pad: int):
  """The convolution by the path the reference takes at this length (band matrices up to BAND_MAX_LEN)."""
  return (conv_band if u.shape[1] <= BAND_MAX_LEN else conv_unfolded)(u, w, groups, pad)


def active_taps(c, layer_index):
  """[K_max] bool: the taps of layer `layer_index`'s kernel, centred among the largest kernel's (traced inside
  the layer scan)."""
  sizes = kernel_sizes(c)
  k_max = max(sizes)
  k = jnp.asarray(sizes)[layer_index]
  start = (k_max - 1) // 2 - (k - 1) // 2
  j = jnp.arange(k_max)
  return (j >= start) & (j < start + k)


class LongShortRangeAttention(Block):
  """Attention on the first half of the channels, a light or dynamic convolution on the second, concatenated, then
  the residual and norm its norm kind places."""

  @nn.compact
  def __call__(self, x, mask, head_gates=None, positions=None, layer_index=0, at=None):
    """`x` [B, S, E]: the norm kind's attention input; `mask`: (attention bias, groups), what `LSRA.mask` made;
    the other arguments are MultiHeadAttention's (`at` is not supported: the kind does not compute rows)."""
    assert at is None, "lsra computes every position (LSRA.computes_rows is False)"
    c = self.cfg
    bias, groups = mask
    half = c.hidden_size // 2
    _, attended = mha.multi_head(self, branch_config(c), x[..., :half], bias, head_gates, positions, layer_index)
    local = self.convolution(x[..., half:], groups, layer_index)
    local = token_dropout(c, c.dropout)(local, deterministic=self.deterministic)
    out = jnp.concatenate([attended, local.astype(attended.dtype)], axis=-1)
    return kinds.of(c, "norm").attention_output(c, x, out)

  def convolution(self, x, groups, layer_index):
    """The convolution branch on x [B, S, d_c]: Linear (or Linear and GLU), the head-wise convolution, Linear."""
    c = self.cfg
    width, heads = x.shape[-1], c.num_heads
    k_max = max(kernel_sizes(c))
    u = dense(c, width, 2 * width if c.lsra_glu else width, (sh.EMBED, sh.MLP), "conv_in", c.use_bias)(x)
    if c.lsra_glu:  # torch's nn.GLU: the first half gated by the sigmoid of the second
      a, gate = jnp.split(u, 2, axis=-1)
      u = a * jax.nn.sigmoid(gate)
    if c.lsra_conv == "dynamic":  # a kernel per position from the branch's own input (weight_linear, no bias)
      logits = dense(c, width, (heads, k_max), (sh.MLP, sh.HEADS, None), "conv_weights", False)(u)
    else:
      kernel = self.param("conv_kernel", kernel_init(c, (sh.HEADS, None)), (heads, k_max), jnp.float32)
      logits = jnp.broadcast_to(kernel, (*x.shape[:2], heads, k_max))
    # Softmax over this layer's taps in float32; the others (a smaller kernel than the largest) get exactly 0.
    logits = jnp.where(active_taps(c, layer_index), logits.astype(jnp.float32), -1e9)
    w = jax.nn.softmax(logits, axis=-1)
    w = token_dropout(c, weight_dropout(c))(w, deterministic=self.deterministic)  # DropConnect, per position
    y = convolve(u, w, groups, (k_max - 1) // 2)
    return dense(c, width, width, (sh.MLP, sh.EMBED), "conv_out", c.use_bias, out=True)(y)

  @staticmethod
  def init_args(c, x):
    """Arguments that initialize the block alone (ALBERT's shared blocks): a zero bias, one example."""
    return (x, (jnp.zeros((1, 1, 1, 1), jnp.float32), jnp.ones(x.shape[:2], jnp.int32)))


def weight_dropout(c) -> float:
  """The DropConnect rate of the convolution kernels: EncoderConfig.lsra_weight_dropout, or attention_dropout
  when negative (the reference's `weight_dropout` default)."""
  return c.lsra_weight_dropout if c.lsra_weight_dropout >= 0 else c.attention_dropout


@kinds.register("attention", "lsra")
class LSRA(mha.AttentionKind):
  """Long-short range attention: attention on half the channels, a convolution on the other half."""

  block = LongShortRangeAttention
  computes_rows = False  # the convolution reads each row's neighbours: no [CLS]-only last layer
  fused = False  # its attention half runs the xla implementation
  hf_family = ""  # transformers has no Lite Transformer encoder

  def check(self, m):
    check(m.hidden_size % (2 * m.num_heads) == 0 and not m.head_size,
          f"model.attention_kind=lsra splits model.hidden_size={m.hidden_size} into two halves of "
          f"model.num_heads={m.num_heads} heads each; use a hidden_size divisible by 2 x num_heads (and head_size=0)")
    check(m.attention in ("auto", "xla"), f"model.attention_kind=lsra runs its attention half with the xla "
          f"implementation, not model.attention={m.attention}; use --config.model.attention=xla")
    check(m.position != "rope", "model.attention_kind=lsra has no rotary positions (their tables are made for "
          "full-width heads); use --config.model.position=learned")
    check(m.lsra_conv in CONVS, f"model.lsra_conv={m.lsra_conv!r}; use one of {', '.join(CONVS)}")
    sizes = parse_kernel_sizes(m.lsra_kernel_sizes)
    check(len(sizes) in (0, 1, m.num_layers) and all(k >= 1 for k in sizes),
          f"model.lsra_kernel_sizes={m.lsra_kernel_sizes!r} must give one positive kernel size, or one per layer "
          f"(model.num_layers={m.num_layers}), e.g. 3,7,15,31,31,31; empty: the reference's 3,7,15,31,...")

  def mask(self, c, groups):
    """What every layer takes: the attention bias for the attention half and the groups for the convolution."""
    return mha.attention_bias(groups), groups

  def forward_flops(self, c, seq_len: int, layer: int) -> float:
    """Forward FLOPs per token of layer `layer`: the attention half as mha counts it at half width; the branch's
    Linears, the dynamic kernels' Linear and the convolution as it runs (a band matrix's whole row up to
    BAND_MAX_LEN tokens, else every tap of the largest kernel)."""
    attention = kinds.get("attention", "mha").forward_flops(branch_config(c), seq_len, layer)
    width, k_max = c.hidden_size - c.hidden_size // 2, max(kernel_sizes(c))
    linears = 2 * width * width * (3 if c.lsra_glu else 2)
    weights = 2 * width * c.num_heads * k_max if c.lsra_conv == "dynamic" else 0
    taps = seq_len if seq_len <= BAND_MAX_LEN else k_max
    return attention + linears + weights + 2 * taps * width
