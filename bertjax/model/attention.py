"""Attention implementations, chosen by `model.attention` (`IMPLEMENTATIONS`).

- `xla`: the encoder's own einsum + float32 softmax over an additive [B, 1, S, S] bias. The reference path:
  attention dropout, attention maps for inference, any platform. It materializes [B, H, S, S] scores and
  probabilities, forward and backward.
- `dot_product`: `jax.nn.dot_product_attention(implementation="xla")`, JAX's portable path (a check on the
  fused kernels' interface; no attention dropout).
- `cudnn`: the same call with `implementation="cudnn"`, cuDNN's fused flash attention (NVIDIA GPUs, bf16 or
  fp16 compute); scores never leave on-chip memory.
- `splash`: the Pallas splash-attention kernel for TPUs (`jax.experimental.pallas.ops.tpu.splash_attention`),
  run per device under `shard_map` (batch and heads split as the logical axis rules say).
- `auto`: cudnn on GPU, splash on TPU, xla on CPU; xla wherever attention dropout is on.

Fused kernels have no dropout on the attention probabilities, so choosing one needs
`model.attention_dropout=0` (recent BERT recipes such as MosaicBERT train without it; BERT, RoBERTa,
ALBERT and ELECTRA were published with 0.1). Every implementation keeps attention inside each example's
group (`groups`: 0 = padding, one id per packed example): the fused ones read it as segment ids, so a
padding token attends only to padding and no query row is ever fully masked.

Local (sliding-window) layers, as ModernBERT alternates them with global ones, see only keys at most
`half_window` positions away (|q - k| <= half_window, transformers' bidirectional sliding-window mask), in
every implementation: xla, dot_product and cudnn add the band to their mask (whether a layer is local may be a
traced value inside the layer scan; cuDNN's `local_window_size` has no right-hand window without a causal mask);
splash builds a `LocalMask` and a full kernel and `lax.cond` picks the layer's (a kernel's mask is static), so
the scan keeps one body and compile time stays flat in depth.
"""

import math

import jax
import jax.numpy as jnp
from flax import linen as nn
from jax.sharding import PartitionSpec as P

from bertjax.core import sharding as sh
from bertjax.core.errors import UserError

IMPLEMENTATIONS = ("auto", "xla", "dot_product", "cudnn", "splash")
FUSED_PLATFORM = {"cudnn": "gpu", "splash": "tpu"}  # a fused kernel and the only platform it runs on
WITHOUT_DROPOUT = ("dot_product", "cudnn", "splash")  # implementations that cannot drop attention probabilities
LOW_PRECISION_ONLY = {"cudnn": ("bfloat16", "float16")}  # cuDNN's flash attention has no float32 kernel


SPLASH_BLOCK = 128  # splash attention tiles the sequence in blocks of (multiples of) 128


def check(requested: str, attention_dropout: float, dtype: str, seq_lens=()):
  """Platform-independent checks of a requested implementation (config validation); `seq_lens`: every
  sequence length the run trains at."""
  if requested not in IMPLEMENTATIONS:
    raise UserError(f"model.attention={requested!r}; use one of {', '.join(IMPLEMENTATIONS)}")
  if requested in WITHOUT_DROPOUT and attention_dropout > 0:
    raise UserError(f"model.attention={requested} applies no dropout to attention probabilities, but "
                    f"model.attention_dropout={attention_dropout}; set --config.model.attention_dropout=0, "
                    "or use --config.model.attention=xla (or auto, which falls back to xla)")
  if requested in LOW_PRECISION_ONLY and dtype not in LOW_PRECISION_ONLY[requested]:
    raise UserError(f"model.attention={requested} needs model.dtype bfloat16 or float16 (model.dtype={dtype}); "
                    "set --config.model.dtype=bfloat16 or use --config.model.attention=xla")
  odd = [s for s in seq_lens if s % SPLASH_BLOCK]
  if requested == "splash" and odd:
    raise UserError(f"model.attention=splash tiles sequences in blocks of {SPLASH_BLOCK}, and seq_len {odd[0]} is "
                    f"not a multiple of {SPLASH_BLOCK}; use such a seq_len or --config.model.attention=xla")


def resolve(requested: str, attention_dropout: float, platform: str, dtype: str = "float32",
            strict: bool = True) -> tuple[str, str]:
  """(implementation, notice) for a run on `platform` ('cpu', 'gpu', 'tpu'); notice is '' or one line saying
  why another implementation than the requested one runs. A fused kernel named for another platform is an
  error when `strict` (training, aot), else xla (inference and interop load anything anywhere)."""
  if requested == "auto":
    fused = {"gpu": "cudnn", "tpu": "splash"}.get(platform)
    if fused is None:
      return "xla", ""
    if attention_dropout > 0:
      return "xla", (f"model.attention=auto: attention_dropout={attention_dropout} > 0, which {fused} cannot "
                     f"apply: using xla attention (--config.model.attention_dropout=0 selects {fused})")
    if fused in LOW_PRECISION_ONLY and dtype not in LOW_PRECISION_ONLY[fused]:
      return "xla", f"model.attention=auto: {fused} needs bfloat16 compute (model.dtype={dtype}): using xla attention"
    return fused, ""
  need = FUSED_PLATFORM.get(requested)
  if need and platform != need:
    if strict:
      raise UserError(f"model.attention={requested} runs on {need.upper()} only, and this run's devices are "
                      f"{platform.upper()}; use --config.model.attention=auto or xla")
    return "xla", f"model.attention={requested} runs on {need.upper()} only: using xla attention on {platform.upper()}"
  return requested, ""


def segment_mask(groups):
  """[B, 1, S, S] boolean: query and key in the same group (padding, group 0, attends to padding only)."""
  return (groups[:, :, None] == groups[:, None, :])[:, None]


def band(seq_len: int, half_window: int):
  """[S, S] boolean: key within half_window positions of the query."""
  i = jnp.arange(seq_len)
  return jnp.abs(i[:, None] - i[None, :]) <= half_window


def window_bias(seq_len: int, half_window: int, local):
  """Additive [1, 1, S, S] bias of a local layer for the xla implementation (0 everywhere when `local` is
  False; `local` may be traced)."""
  outside = jnp.logical_and(local, jnp.logical_not(band(seq_len, half_window)))
  return jnp.where(outside, -1e9, 0.0).astype(jnp.float32)[None, None]


def _pick(local, local_fn, global_fn):
  """local_fn() on a local layer, else global_fn(): a Python branch when `local` is known, lax.cond in the scan."""
  if local is False or local is True:
    return local_fn() if local else global_fn()
  return jax.lax.cond(local, local_fn, global_fn)


def fused(impl: str, q, k, v, groups, scale: float, interpret: bool = False, local=False, half_window: int = 0):
  """The context [B, S, H, D] of queries, keys and values [B, S, H, D] under a fused (dropout-free)
  implementation; `groups` [B, S] keeps attention inside each example, `local` (a bool, or traced) limits it to
  `half_window` positions either side. `interpret` runs splash in Pallas' interpreter (any platform: tests)."""
  if impl in ("dot_product", "cudnn"):
    # The segment mask is a dense [B, 1, S, S] operand already, so a local layer's band joins it (cuDNN's own
    # local_window_size has no right-hand window without a causal mask).
    mask = segment_mask(groups)
    if local is not False:
      mask = mask & jnp.logical_or(jnp.logical_not(local), band(q.shape[1], half_window))
    return jax.nn.dot_product_attention(q, k, v, mask=mask, scale=scale,
                                        implementation="xla" if impl == "dot_product" else "cudnn")
  if impl == "splash":
    call = lambda window: splash(q, k, v, groups, scale, interpret, window)
    return _pick(local, lambda: call(half_window), lambda: call(None))
  raise ValueError(f"no fused attention {impl!r}")


def _splash_local(q, k, v, groups, scale: float, interpret: bool, half_window=None):
  """Splash attention on the examples and heads one device holds."""
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as sk
  from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as sm

  _, s, h, _ = q.shape
  block = 512 if s % 512 == 0 else SPLASH_BLOCK
  sizes = sk.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
                        block_kv_dkv=block, block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
  one = sm.FullMask((s, s)) if half_window is None else sm.LocalMask((s, s), (half_window, half_window), offset=0)
  kernel = sk.make_splash_mha(sm.MultiHeadMask([one] * h), block_sizes=sizes, head_shards=1,
                              q_seq_shards=1, interpret=interpret)
  heads_first = lambda x: jnp.swapaxes(x, 1, 2)  # the kernel takes [H, S, D] per example
  out = jax.vmap(kernel)(heads_first(q * jnp.asarray(scale, q.dtype)), heads_first(k), heads_first(v),
                         segment_ids=sk.SegmentIds(q=groups, kv=groups))
  return heads_first(out)


def splash(q, k, v, groups, scale: float, interpret: bool = False, half_window=None):
  """Splash attention over the mesh in context: a Pallas kernel is not partitioned by XLA, so it runs under
  shard_map with batch and heads split the way the logical axis rules split the activations (the sequence
  stays whole). `half_window`: None, or a local layer's half window (a LocalMask kernel)."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty:
    return _splash_local(q, k, v, groups, scale, interpret, half_window)
  batch, heads = nn.logical_to_mesh_axes((sh.BATCH, sh.HEADS))
  if heads is not None and q.shape[2] % _size(mesh, heads):
    heads = None  # heads the tensor axis does not divide are kept whole, as their weights are
  qkv = P(batch, None, heads, None)
  return jax.shard_map(lambda *a: _splash_local(*a, scale, interpret, half_window), mesh=mesh,
                       in_specs=(qkv, qkv, qkv, P(batch, None)), out_specs=qkv, check_vma=False)(q, k, v, groups)


def _size(mesh, axes) -> int:
  return math.prod(mesh.shape[a] for a in (axes if isinstance(axes, tuple) else (axes,)))
