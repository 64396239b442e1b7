"""The BERT-family encoder: embeddings, post-LN transformer layers scanned over depth, ALBERT sharing.

One encoder serves BERT, RoBERTa, ALBERT and ELECTRA, and ModernBERT-class encoders through options (rotary
positions, GeGLU, pre-LayerNorm, no biases, alternating local/global attention; docs/modernbert.md). Its hyperparameters come in a frozen
`EncoderConfig`; every parameter carries logical axis names (bertjax.core.sharding) so that sharding is a
config choice. Layers run under `nn.scan` (stacked parameters, compile time flat in depth; the CPU unrolls
it, bertjax.model.config.scan_unroll). ALBERT's cross-layer sharing keeps a shared block once per group
*outside* the scan and hands it to every scanned layer, so all sharing modes are the same scanned layer with
a different set of blocks it owns. A caller that keeps only a few positions (a [CLS] classifier) passes them as
`outputs_at`: the last layer then computes only those queries (Encoder.split_stack).
"""

import dataclasses
import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
from flax import linen as nn

from bertjax.core import sharding as sh
from bertjax.model import attention as attention_lib
from bertjax.model import rope as rope_lib

SHARING_MODES = ("none", "all", "attention", "ffn")
# Up to this depth the layer scan is unrolled (same parameters, initialization and randomness): a rolled
# loop stacks every layer's saved activations into [layers, ...] buffers (zero-filled, then sliced in the
# backward pass), ~10% of a 2-layer CPU step, while a few unrolled layers add little compile time. Deeper
# models keep the rolled loop, so their compile time stays flat in depth, except on the CPU, where step time
# wins and every layer is unrolled (bertjax.model.config.scan_unroll).
UNROLL_MAX_LAYERS = 4


def default_unroll(num_layers: int) -> int:
  """Layers per scan iteration when the config leaves it open (scan_unroll 0 off the CPU): all up to
  UNROLL_MAX_LAYERS, else 1."""
  return num_layers if num_layers <= UNROLL_MAX_LAYERS else 1


def layers_per_iteration(c) -> int:
  """How many layers one iteration of the layer scan runs (its `unroll`)."""
  return c.scan_unroll or default_unroll(c.num_layers)


# Non-trainable state a quantizer keeps per layer (bertjax.compress.q8bert's activation ranges): stacked
# along the layer scan like the params.
QUANT_RANGES = "quant_ranges"

REMAT_POLICIES = {
    "none": None,  # keep every activation: fastest, most memory
    "full": jax.checkpoint_policies.nothing_saveable,  # recompute the whole layer in the backward pass
    "dots": jax.checkpoint_policies.checkpoint_dots,  # keep matmul outputs, recompute the cheap rest
    "dots_no_batch": jax.checkpoint_policies.checkpoint_dots_with_no_batch_dims,  # keep weight matmuls only
}


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
  """Hyperparameters of one encoder (the layers see nothing else of the run config)."""

  vocab_size: int
  hidden_size: int
  num_layers: int
  num_heads: int
  intermediate_size: int
  embedding_size: int  # E: equals hidden_size unless embeddings are factorized (ALBERT, ELECTRA-small)
  max_positions: int = 512
  type_vocab_size: int = 2
  dropout: float = 0.1
  attention_dropout: float = 0.1
  layer_norm_eps: float = 1e-12
  init_std: float = 0.02
  sharing: str = "none"  # which blocks all layers of a group share: none | all | attention | ffn
  num_groups: int = 1  # ALBERT num_hidden_groups: distinct parameter sets of the shared blocks
  dtype: Any = jnp.float32  # compute dtype; parameters stay float32
  remat: str = "none"  # key of REMAT_POLICIES
  activation: str = "gelu"  # gelu (exact erf, BERT) | gelu_new (tanh approximation, ALBERT)
  position_offset: int = 0  # first position id (HF RoBERTa counts from padding_idx + 1 = 2)
  scan_unroll: int = 0  # layers per scan iteration; 0: all of them up to UNROLL_MAX_LAYERS, else 1
  attention: str = "xla"  # resolved implementation (bertjax.model.attention): xla | dot_product | cudnn | splash
  head_size: int = 0  # width of one head; 0: hidden_size // num_heads (set when heads were pruned away)
  # Dense matmuls contract the kernel in its own shape, as a quantization library intercepting dot_general
  # needs (qwix matches the operand to the parameter; bertjax.compress.quantize sets it); else as a 2-D [in, out] matrix.
  quantizable: bool = False
  # Sequence length dropout masks are drawn for (0: the input's own). Fine-tuning sets seq_len, so a batch
  # cut to a shorter length bucket gets the fixed-length batch's masks cut to its length: buckets change
  # the cost of a step, not its randomness (bertjax.finetune.batches).
  dropout_length: int = 0
  # ModernBERT-class options (docs/modernbert.md); the defaults are BERT's and change nothing.
  position: str = "learned"  # learned (absolute table) | rope (rotary, from position_ids; no table)
  rope_theta: float = 160_000.0  # RoPE base of the global-attention layers (ModernBERT's global_rope_theta)
  local_rope_theta: float = 10_000.0  # ... of the local (sliding-window) layers (ModernBERT's local_rope_theta)
  ffn: str = "mlp"  # mlp (dense-act-dense) | geglu (act(x W_in) * (x W_gate), then W_out; intermediate x2)
  norm: str = "post"  # post (BERT) | pre (LN before each block, a final LN; the first layer's attention LN skipped)
  use_bias: bool = True  # biases of the encoder's dense layers, its LayerNorms and the MLM transform
  local_layers: tuple = ()  # per layer, True: sliding-window attention; empty: every layer global
  local_window: int = 0  # a local layer's whole window: a token sees tokens at most local_window // 2 away
  init: str = "bert"  # bert (truncated normal init_std everywhere) | modernbert (output projections / sqrt(2 L))
  # How a dense layer's weight gradient is computed: "xla" (autodiff: x^T @ dy with x transposed in the
  # dot, which XLA:CPU's YNNPACK rejects and leaves to Eigen) | "transposed" (`matmul_pretransposed`).
  dense_grad: str = "xla"

  @property
  def head_dim(self) -> int:
    return self.head_size or self.hidden_size // self.num_heads

  @property
  def half_window(self) -> int:
    return self.local_window // 2


_SQRT_HALF, _INV_SQRT_2PI = 0.5**0.5, (2 * 3.141592653589793) ** -0.5


@jax.custom_vjp
def gelu(x):
  """Exact (erf) GELU, x * Phi(x). Its gradient is written out so that the backward pass keeps only x:
  autodiff of erf would keep erf(x) and exp(-x^2/2) too, [tokens, FFN] arrays that a scan over layers
  stacks per layer; recomputing them is cheaper than storing them (~10% of a CPU step, BERT-tiny)."""
  return x * (jax.lax.erf(x * _SQRT_HALF) + 1) * 0.5


def _gelu_fwd(x):
  return gelu(x), x


def _gelu_bwd(x, g):
  cdf = (jax.lax.erf(x * _SQRT_HALF) + 1) * 0.5
  pdf = jnp.exp(-0.5 * x * x) * _INV_SQRT_2PI
  return (g * (cdf + x * pdf),)


gelu.defvjp(_gelu_fwd, _gelu_bwd)


def activation(cfg: EncoderConfig, x):
  """The FFN / MLM-head activation: exact GELU, or its tanh approximation where the reference uses it
  (ALBERT: google-research/albert modeling.py's gelu(); HF's gelu_new)."""
  if cfg.activation == "gelu_new":
    return nn.gelu(x, approximate=True)
  return gelu(x)


def _init(cfg: EncoderConfig, names, out: bool = False):
  """Truncated-normal(0.02) initializer (BERT's: cut at 2 std) carrying logical axis names. Under init=modernbert an
  output projection (`out`: attention and FFN outputs, the MLM transform) gets std init_std / sqrt(2 x layers), as
  transformers' ModernBertPreTrainedModel._init_weights ("out"; cutoff factor 2 as well)."""
  std = cfg.init_std / math.sqrt(2 * cfg.num_layers) if out and cfg.init == "modernbert" else cfg.init_std
  return nn.with_logical_partitioning(nn.initializers.truncated_normal(std), names)


def _zeros(names):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def _ones(names):
  return nn.with_logical_partitioning(nn.initializers.ones_init(), names)


def _normalize(x, eps):
  mean = x.mean(-1, keepdims=True)
  centered = x - mean
  rstd = jax.lax.rsqrt((centered * centered).mean(-1, keepdims=True) + eps)
  return centered * rstd, rstd


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _layer_norm(x, scale, bias, eps):
  return _normalize(x, eps)[0] * scale + bias


def _layer_norm_fwd(x, scale, bias, eps):
  xhat, rstd = _normalize(x, eps)
  return xhat * scale + bias, (xhat, rstd, scale)


def _layer_norm_bwd(eps, res, g):
  # The textbook LayerNorm gradient from the normalized input and 1/std only: autodiff would keep
  # the centered input, its square and the broadcast statistics as well.
  xhat, rstd, scale = res
  gs = g * scale
  dx = rstd * (gs - gs.mean(-1, keepdims=True) - xhat * (gs * xhat).mean(-1, keepdims=True))
  axes = tuple(range(g.ndim - 1))
  return dx, (g * xhat).sum(axes), g.sum(axes)


_layer_norm.defvjp(_layer_norm_fwd, _layer_norm_bwd)


class LayerNorm(nn.Module):
  """LayerNorm over the last axis (params `scale`, `bias`) computed in float32 whatever the compute
  dtype (bf16 LayerNorm destabilises training); returns float32."""

  epsilon: float
  names: tuple  # logical axis name of the normalized axis
  use_bias: bool = True  # False: no `bias` parameter (ModernBERT's norm_bias=False)

  @nn.compact
  def __call__(self, x):
    scale = self.param("scale", _ones(self.names), (x.shape[-1],), jnp.float32)
    if self.use_bias:
      bias = self.param("bias", _zeros(self.names), (x.shape[-1],), jnp.float32)
    else:
      bias = jnp.zeros_like(scale)
    return _layer_norm(x.astype(jnp.float32), scale, bias, self.epsilon)


def layer_norm(cfg: EncoderConfig, name: str, names=(sh.EMBED,)) -> LayerNorm:
  """BERT's LayerNorm (eps from the config) in float32; without a bias where the config has none."""
  return LayerNorm(cfg.layer_norm_eps, tuple(names), cfg.use_bias, name=name)


def _threefry2x32(k0, k1, x0, x1):
  """The Threefry-2x32 hash (20 rounds) as JAX computes it, written out unrolled: JAX lowers it as a
  5-trip loop on CPU, whose full-size loop-carried arrays cost more than the arithmetic."""
  rotations = ((13, 15, 26, 6), (17, 29, 16, 24))
  ks = (k0, k1, k0 ^ k1 ^ jnp.uint32(0x1BD11BDA))
  x0, x1 = x0 + ks[0], x1 + ks[1]
  for i in range(5):
    for r in rotations[i % 2]:
      x0 = x0 + x1
      x1 = ((x1 << jnp.uint32(r)) | (x1 >> jnp.uint32(32 - r))) ^ x0
    x0, x1 = x0 + ks[(i + 1) % 3], x1 + ks[(i + 2) % 3] + jnp.uint32(i + 1)
  return x0, x1


def _key_words(rng):
  """The two uint32 words of a threefry key (new-style typed key or raw uint32[2])."""
  return jax.random.key_data(rng) if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key) else rng


def _is_threefry(rng) -> bool:
  if jax.dtypes.issubdtype(rng.dtype, jax.dtypes.prng_key):
    return "threefry" in str(jax.random.key_impl(rng))
  return rng.shape == (2,) and "threefry" in jax.config.jax_default_prng_impl


def keep_mask(rng, shape, keep_prob: float, full_shape=None):
  """Dropout's Bernoulli(keep_prob) mask from the threefry hash, four 16-bit draws per hash.

  One Threefry-2x32 evaluation gives 64 random bits; jax.random.bernoulli spends them on one element,
  and the hash was a third of a CPU train step at tiny size. Here each element compares 16 bits with
  round(keep_prob * 2^16), so keep_prob is exact to 2^-17 (0.9 -> 0.899994). Counters run over the
  leading dimensions and a quarter of the last, so the mask shards like the activations it masks.
  `full_shape` (each axis at least `shape`'s): the mask is the corner of the one drawn for that shape,
  computed without drawing the rest (counters keep the full shape's strides).
  """
  *lead, last = shape
  quarter = -(-last // 4)
  if full_shape is None or tuple(full_shape) == tuple(shape):
    counts = jax.lax.iota(jnp.uint32, math.prod(lead) * quarter).reshape((*lead, quarter))
  else:
    dims, full_dims = (*lead, quarter), (*full_shape[:-1], -(-full_shape[-1] // 4))
    strides = [math.prod(full_dims[i + 1:]) for i in range(len(dims))]
    counts = sum(jax.lax.broadcasted_iota(jnp.uint32, dims, i) * jnp.uint32(stride)
                 for i, stride in enumerate(strides))
  k = _key_words(rng)
  b0, b1 = _threefry2x32(k[0], k[1], jnp.zeros_like(counts), counts)
  lo = jnp.uint32(0xFFFF)
  lanes = jnp.stack([b0 & lo, b0 >> 16, b1 & lo, b1 >> 16], axis=-1).reshape((*lead, 4 * quarter))
  return lanes[..., :last] < jnp.uint32(round(keep_prob * 2**16))


class Dropout(nn.Module):
  """flax.linen.Dropout (same name, rng collection and scaling) with a cheaper mask: `keep_mask` for
  threefry keys (4x fewer hash evaluations than jax.random.bernoulli); other key types fall back to it.
  With `length`, the `seq_axes` of the input are drawn as if that long (EncoderConfig.dropout_length)."""

  rate: float
  deterministic: bool | None = None
  rng_collection: str = "dropout"
  seq_axes: tuple = ()
  length: int = 0

  @nn.compact
  def __call__(self, inputs, deterministic: bool | None = None):
    deterministic = nn.merge_param("deterministic", self.deterministic, deterministic)
    if self.rate == 0.0 or deterministic:
      return inputs
    if self.rate == 1.0:
      return jnp.zeros_like(inputs)
    keep_prob = 1.0 - self.rate
    rng = self.make_rng(self.rng_collection)
    full = tuple(max(n, self.length) if i in self.seq_axes else n for i, n in enumerate(inputs.shape))
    if _is_threefry(rng) and inputs.ndim >= 1 and math.prod(full) < 2**32:
      mask = keep_mask(rng, inputs.shape, keep_prob, full)
    else:
      mask = jax.random.bernoulli(rng, p=keep_prob, shape=full)[tuple(slice(n) for n in inputs.shape)]
    return jax.lax.select(mask, inputs / keep_prob, jnp.zeros_like(inputs))


def token_dropout(c: EncoderConfig, rate: float, seq_axes=(1,)) -> Dropout:
  """Dropout of activations with sequence axes ([B, S, ...] hidden states, [B, H, S, S] probabilities),
  drawn at c.dropout_length so that padding to a shorter length keeps the masks of the real positions."""
  return Dropout(rate, seq_axes=tuple(seq_axes), length=c.dropout_length)


class Dense(nn.Module):
  """x @ kernel + bias contracting x's last `len(in_shape)` axes; the kernel is made in its final shape
  (not flattened as nn.DenseGeneral does) so its logical axis names always match its rank."""

  cfg: EncoderConfig
  in_shape: tuple
  out_shape: tuple
  names: tuple  # logical names of the kernel's axes: in axes then out axes
  use_bias: bool = True
  out: bool = False  # an output projection (init=modernbert scales its init)

  @nn.compact
  def __call__(self, x):
    n_in = len(self.in_shape)
    kernel = self.param("kernel", _init(self.cfg, self.names, self.out), self.in_shape + self.out_shape)
    bias = self.param("bias", _zeros(self.names[n_in:]), self.out_shape) if self.use_bias else None
    return self.product(x, kernel, bias)

  def product(self, x, kernel, bias):
    """x @ kernel (+ bias) in the compute dtype. A method of its own so that a quantizer can intercept it with
    its operands in hand (flax nn.intercept_methods; bertjax.compress.q8bert)."""
    # flax's promote_dtype (as nn.Dense calls it): quantization libraries intercept it (qwix: bertjax.compress.quantize).
    x, kernel = nn.dtypes.promote_dtype(x, kernel, dtype=self.cfg.dtype)
    y = tokens_matmul(x, kernel, len(self.in_shape), flat_kernel=not self.cfg.quantizable, grad=self.cfg.dense_grad)
    return y if bias is None else y + bias.astype(self.cfg.dtype)


DENSE_GRADS = ("xla", "transposed")


@jax.custom_vjp
def matmul_pretransposed(x, w):
  """x [T, I] @ w [I, O], whose weight gradient multiplies an already-transposed copy of x: dW = (x^T) @ dy
  with x^T materialized behind an optimization barrier (without it XLA folds the transpose back into the dot).
  XLA:CPU's YNNPACK then takes every dot of the layer; the cost is one [I, T] copy per layer
  (EncoderConfig.dense_grad="transposed"; measured in docs/cpu.md)."""
  return x @ w


def _pretransposed_fwd(x, w):
  return x @ w, (x, w)


def _pretransposed_bwd(res, g):
  x, w = res
  xt = jax.lax.optimization_barrier(x.T)
  return g @ w.T, (xt @ g).astype(w.dtype)


matmul_pretransposed.defvjp(_pretransposed_fwd, _pretransposed_bwd)


def tokens_matmul(x, kernel, n_in: int, flat_kernel: bool = True, grad: str = "xla"):
  """x [..., *in] @ kernel [*in, *out] -> [..., *out], as one [tokens, in] x [in, out] matmul.

  The weight gradient contracts over every token; as a 2-D matmul it does so in place, while contracting
  the [batch, seq] axes of a 3-D activation makes XLA:CPU transpose and copy the activation first, one
  per weight gradient (~7% of a BERT-base CPU step, ~15% of a tiny one). A kernel of several in or out axes
  (q/k/v [E, heads, head_dim], the attention output [heads, head_dim, E]) is flattened to 2-D too: contracted
  in its own shape it costs a transpose of the kernel or of the activation per matmul and gradient. Merging
  adjacent axes is a bitcast, and a batch axis sharded over the mesh stays the major part of the merged one.
  `flat_kernel=False` keeps the kernel's shape for quantization (EncoderConfig.quantizable); `grad` is
  EncoderConfig.dense_grad (a flat kernel only)."""
  lead, out_shape = x.shape[: x.ndim - n_in], kernel.shape[n_in:]
  if flat_kernel:
    x2 = x.reshape(math.prod(lead), math.prod(kernel.shape[:n_in]))
    kernel, n_in = kernel.reshape(x2.shape[1], math.prod(out_shape)), 1
  else:
    x2 = x.reshape(math.prod(lead), *x.shape[x.ndim - n_in:])
  if flat_kernel and grad == "transposed":
    y = matmul_pretransposed(x2, kernel)
  else:
    y = jax.lax.dot_general(x2, kernel, ((tuple(range(1, n_in + 1)), tuple(range(n_in))), ((), ())))
  return y.reshape(*lead, *out_shape)


def dense(cfg: EncoderConfig, in_shape, out_shape, names, name: str, bias: bool = True, out: bool = False) -> Dense:
  """A Dense layer in the compute dtype; shapes are ints or tuples of ints. `bias=False`: no bias parameter
  (the encoder's own layers pass cfg.use_bias; task heads keep theirs). `out`: an output projection (see _init)."""
  as_tuple = lambda s: tuple(s) if isinstance(s, (tuple, list)) else (s,)
  return Dense(cfg, as_tuple(in_shape), as_tuple(out_shape), tuple(names), bias, out, name=name)


class Embeddings(nn.Module):
  """Token + learned absolute position (none under rotary positions) + segment embeddings, LayerNorm and
  dropout, width E."""

  cfg: EncoderConfig

  def setup(self):
    c = self.cfg
    self.word = self.param("word", _init(c, (sh.VOCAB, sh.EMBED)), (c.vocab_size, c.embedding_size))
    if c.position == "learned":  # rope: positions enter every attention layer instead (Encoder)
      self.position = self.param("position", _init(c, (None, sh.EMBED)), (c.max_positions, c.embedding_size))
    if c.type_vocab_size:  # 0: no segment embeddings (DistilBERT)
      self.type = self.param("type", _init(c, (None, sh.EMBED)), (c.type_vocab_size, c.embedding_size))
    self.ln = layer_norm(c, "ln")
    self.drop = token_dropout(c, c.dropout)

  def __call__(self, input_ids, type_ids, deterministic: bool, position_ids=None):
    """position_ids [B, S] restart the positions of packed examples; default 0..S-1 (+ offset)."""
    word, position, type_table = self.tables()
    x = jnp.take(word, input_ids, axis=0)
    if position is None:
      pos = 0
    elif position_ids is None:
      pos = position[None, self.cfg.position_offset : self.cfg.position_offset + input_ids.shape[1]]
    else:
      pos = jnp.take(position, position_ids + self.cfg.position_offset, axis=0)
    x = x + pos + (jnp.take(type_table, type_ids, axis=0) if self.cfg.type_vocab_size else 0)
    x = self.drop(self.ln(x), deterministic=deterministic)
    return x.astype(self.cfg.dtype)

  def tables(self):
    """(word, position, segment or None) tables as the lookups read them: a method of its own so that a
    quantizer can intercept it (flax nn.intercept_methods; bertjax.compress.q8bert)."""
    return (self.word, self.position if self.cfg.position == "learned" else None,
            self.type if self.cfg.type_vocab_size else None)

  def attend(self, x):
    """Logits against the word embeddings: the MLM decoder tied to the input embeddings."""
    return tokens_matmul(x, self.word.astype(x.dtype).T, 1, grad=self.cfg.dense_grad)


class Block(nn.Module):
  """A part of the encoder: its hyperparameters, and whether dropout is off (inference, eval)."""

  cfg: EncoderConfig
  deterministic: bool = True


class Attention(Block):
  """Multi-head self-attention: with residual and post-LayerNorm (BERT's attention sub-layer), or under
  norm=pre the block's output alone (the layer adds it to the residual stream)."""

  @nn.compact
  def __call__(self, x, mask, head_gates=None, rope=None, local=False, at=None):
    """`mask`: the additive bias [B, 1, S, S] of `attention_bias` for the xla implementation, the groups
    [B, S] for a fused one (`attention_mask`). `head_gates`: optional [heads] of this layer (bertjax.compress.prune).
    `rope`: this layer's (cos, sin) [B, S, head_dim / 2] (bertjax.model.rope), or None. `local`: whether this
    layer attends within its sliding window (a bool, or a traced one inside the layer scan). `at`: optional
    [B, K] positions, the only queries computed (xla implementation): the output is [B, K, E], keys and values
    still come from every position."""
    c = self.cfg
    proj = lambda n: dense(c, c.hidden_size, (c.num_heads, c.head_dim), (sh.EMBED, sh.HEADS, sh.KV), n, c.use_bias)
    xq = x if at is None else rows_at(x, at)
    q, k, v = proj("query")(xq), proj("key")(x), proj("value")(x)
    if rope is not None:
      q = rope_lib.apply(q, rope if at is None else tuple(rows_at(t, at) for t in rope))
      k = rope_lib.apply(k, rope)
    if c.attention == "xla":
      if local is not False:  # keys further than the half window away are masked on local layers
        mask = mask + attention_lib.window_bias(x.shape[1], c.half_window, local)
      if at is not None:  # the queries' rows of the [B, 1, S, S] bias
        mask = jnp.take_along_axis(mask, at[:, None, :, None], axis=2)
      # Scores, mask and softmax in float32: bf16 softmax loses the small probabilities.
      scores = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)
      probs = jax.nn.softmax(scores * c.head_dim**-0.5 + mask, axis=-1)
      # Kept only when the caller asks for the "intermediates" collection (inference's attention maps);
      # otherwise sow does nothing.
      self.sow("intermediates", "attention_probs", probs)
      probs = token_dropout(c, c.attention_dropout, (2, 3))(probs, deterministic=self.deterministic)
      ctx = jnp.einsum("bhqk,bkhd->bqhd", probs.astype(c.dtype), v)
    else:  # a fused kernel: no [B, H, S, S] array, no attention dropout (config validation sees to it)
      assert at is None, "query positions need the xla implementation (Encoder falls back to every position)"
      ctx = attention_lib.fused(c.attention, q, k, v, mask, c.head_dim**-0.5, local=local,
                                half_window=c.half_window).astype(c.dtype)
    if head_gates is not None:  # 0 removes a head exactly (its context never reaches the output projection)
      ctx = ctx * head_gates.astype(ctx.dtype)[:, None]
    out = dense(c, (c.num_heads, c.head_dim), c.hidden_size, (sh.HEADS, sh.KV, sh.EMBED), "output", c.use_bias,
                out=True)(ctx)
    out = token_dropout(c, c.dropout)(out, deterministic=self.deterministic)
    if c.norm == "pre":
      return out.astype(c.dtype)
    return layer_norm(c, "ln")(xq + out).astype(c.dtype)


def rows_at(x, at):
  """x [B, S, ...] at positions `at` [B, K]: [B, K, ...]."""
  return jnp.take_along_axis(x, at.reshape(at.shape + (1,) * (x.ndim - 2)), axis=1)


class FeedForward(Block):
  """Position-wise FFN with residual: post-LayerNorm (BERT: dense, exact GELU, dense, then LN(x + h)) or
  pre-LayerNorm (x + FFN(LN(x))); `ffn=geglu` gates it (ModernBERT: act(x W_in) * (x W_gate), dropout, W_out;
  one [H, 2, I] kernel, input half first as HF's Wi chunks it)."""

  @nn.compact
  def __call__(self, x):
    c = self.cfg
    h = layer_norm(c, "ln")(x).astype(c.dtype) if c.norm == "pre" else x
    if c.ffn == "geglu":
      h = dense(c, c.hidden_size, (2, c.intermediate_size), (sh.EMBED, None, sh.MLP), "intermediate", c.use_bias)(h)
      h = activation(c, h[..., 0, :]) * h[..., 1, :]
      h = token_dropout(c, c.dropout)(h, deterministic=self.deterministic)
      h = dense(c, c.intermediate_size, c.hidden_size, (sh.MLP, sh.EMBED), "output", c.use_bias, out=True)(h)
    else:
      h = dense(c, c.hidden_size, c.intermediate_size, (sh.EMBED, sh.MLP), "intermediate", c.use_bias)(h)
      h = activation(c, h)
      h = dense(c, c.intermediate_size, c.hidden_size, (sh.MLP, sh.EMBED), "output", c.use_bias, out=True)(h)
      h = token_dropout(c, c.dropout)(h, deterministic=self.deterministic)
    if c.norm == "pre":
      return (x + h).astype(c.dtype)
    return layer_norm(c, "ln")(x + h).astype(c.dtype)


BLOCKS = {"attention": Attention, "ffn": FeedForward}


def is_stacked(path) -> bool:
  """Whether the parameter at a tree path (jax key path) stacks one tensor per layer or per ALBERT group
  on its leading axis: everything under a scanned `layers` scope or a shared block of the Encoder."""
  return any(getattr(k, "key", None) in ("layers", *BLOCKS) for k in path)


def shared_blocks(sharing: str) -> tuple[str, ...]:
  """Names of the blocks that the layers of a group share under a sharing mode."""
  return {"none": (), "all": ("attention", "ffn"), "attention": ("attention",), "ffn": ("ffn",)}[sharing]


class Layer(Block):
  """One transformer layer; blocks it does not own come in as `shared` parameters (ALBERT sharing).

  Under norm=pre the scan carries (x, LN(x)): each layer owns `out_ln`, the LayerNorm of its output, which
  is the next layer's attention-input norm, and for the last layer the encoder's final norm. So the stack
  holds ModernBERT's parameters exactly (no attention norm in the first layer, whose input is the already
  normalized embeddings) while every layer stays alike for the scan."""

  @nn.compact
  def __call__(self, carry, layer_index, mask, shared, head_gates=None, rope=None, at=None):
    """`at`: optional [B, K] positions, the only ones this layer computes (its output is [B, K, E]; the
    encoder's last layer when only they are wanted)."""
    c = self.cfg
    pre = c.norm == "pre"
    x, xn = carry if pre else (carry, None)
    group = layer_index * c.num_groups // c.num_layers  # ALBERT: consecutive layers form a group
    local = layer_is_local(c, layer_index)
    if rope is not None:
      rope = rope_lib.select(rope, local)
    for name, block in BLOCKS.items():
      args = (xn if pre else x, mask, head_gates, rope, local, at) if name == "attention" else (x,)
      if name in shared:
        params = jax.tree.map(lambda p: p[group], shared[name])
        rngs = {} if self.deterministic else {"dropout": self.make_rng("dropout")}
        shared_block = block(c, self.deterministic, parent=None)
        if self.is_mutable_collection("intermediates"):  # pass the block's sown values on, as its own would be
          y, sown = shared_block.apply({"params": params}, *args, rngs=rngs, mutable="intermediates")
          for key, (value,) in sown.get("intermediates", {}).items():
            self.sow("intermediates", key, value)
        else:
          y = shared_block.apply({"params": params}, *args, rngs=rngs)
      else:
        y = block(c, self.deterministic, name=name)(*args)
      if pre and name == "attention":
        x = (x if at is None else rows_at(x, at)) + y
      else:
        x = y
    x = nn.with_logical_constraint(x, (sh.BATCH, sh.LENGTH, sh.ACT_EMBED))
    self.sow("intermediates", "hidden", x)  # kept only when asked for (distillation's layer losses)
    if pre:
      xn = nn.with_logical_constraint(layer_norm(c, "out_ln")(x).astype(c.dtype), (sh.BATCH, sh.LENGTH, sh.ACT_EMBED))
      return (x, xn), None
    return x, None


def layer_is_local(c: EncoderConfig, layer_index):
  """Whether a layer uses sliding-window attention: a Python bool when every layer is alike, else a traced
  bool read from the per-layer pattern at the scanned layer index."""
  if not any(c.local_layers):
    return False
  if all(c.local_layers):
    return True
  return jnp.asarray(c.local_layers, bool)[layer_index]


def sown_by_layers(intermediates, key: str):
  """The [layers, ...] stack of one value every layer sows (`hidden`, `attention_probs`), from the
  "intermediates" a model's apply returned with that collection mutable: one per encoder, the scanned layers
  stacking it along axis 0."""
  (value,) = [v for path, v in jax.tree_util.tree_leaves_with_path(intermediates["intermediates"]["encoder"])
              if any(getattr(k, "key", None) == key for k in path)]
  return value


def _stacked_init(block_cls, cfg: EncoderConfig, n: int):
  """Initializer of `n` stacked copies of a block's parameters, with a leading `layers` axis name."""

  cfg = dataclasses.replace(cfg, attention="xla")  # the parameters do not depend on the implementation

  def init(rng):
    x = jnp.zeros((1, 1, cfg.hidden_size), cfg.dtype)
    args = (x, jnp.zeros((1, 1, 1, 1), jnp.float32)) if block_cls is Attention else (x,)
    one = lambda r: block_cls(cfg, parent=None).init({"params": r}, *args)["params"]
    stacked = jax.vmap(one)(jax.random.split(rng, n))
    return jax.tree.map(lambda b: b.add_axis(0, {nn.PARTITION_NAME: sh.LAYERS}), stacked,
                        is_leaf=lambda b: isinstance(b, nn.Partitioned))

  return init


def attention_bias(groups):
  """Additive attention bias [B, 1, S, S]: a token attends to tokens of its own nonzero group.

  `groups` is [B, S] int: 0 for padding, and for packed inputs a distinct id per packed example, so that
  attention never crosses examples; an unpacked input passes its padding mask (1 = real token).
  """
  allowed = (groups[:, :, None] == groups[:, None, :]) & (groups[:, None, :] > 0)
  return jnp.where(allowed, 0.0, -1e9).astype(jnp.float32)[:, None]


def attention_mask(cfg: EncoderConfig, groups):
  """What every layer's attention takes: the additive bias for the xla implementation, the groups
  themselves (read as segment ids) for a fused kernel."""
  return attention_bias(groups) if cfg.attention == "xla" else groups


class Encoder(Block):
  """E->H projection (if factorized) and `num_layers` scanned transformer layers."""

  @nn.compact
  def __call__(self, x, groups, head_gates=None, position_ids=None, outputs_at=None):
    """head_gates: optional [layers, heads] multipliers of each head's output (1 = on, 0 = removed).
    position_ids: [B, S] positions (packed rows restart them per example) for rotary positions; default 0..S-1.
    outputs_at: optional [B, K] positions (a classifier's [CLS]): the encoder returns only their hidden states
    [B, K, E], and its last layer computes only them (`last_layer_at`)."""
    c = self.cfg
    if c.embedding_size != c.hidden_size:
      x = dense(c, c.embedding_size, c.hidden_size, (None, sh.EMBED), "embedding_projection")(x)
    shared = {
        name: self.param(name, _stacked_init(BLOCKS[name], c, c.num_groups))
        for name in shared_blocks(c.sharing)
    }
    rope = None
    if c.position == "rope":
      if position_ids is None:
        position_ids = jnp.broadcast_to(jnp.arange(x.shape[1]), x.shape[:2])
      rope = rope_lib.tables(c, position_ids)
    layer = Layer
    if REMAT_POLICIES[c.remat] is not None or c.remat == "full":
      layer = nn.remat(Layer, policy=REMAT_POLICIES[c.remat], prevent_cse=False)
    # Pre-LN: the first layer's attention reads the embeddings as they are (already LayerNormed); the last
    # layer's out_ln is the final norm, so the encoder returns the normalized stream.
    carry = (x, x) if c.norm == "pre" else x
    mask = attention_mask(c, groups)
    if outputs_at is not None and self.last_layer_at():
      out = self.split_stack(layer, carry, mask, shared, head_gates, rope, outputs_at)
    else:
      out, _ = scan_layers(layer, c, c.num_layers)(c, self.deterministic, name="layers")(
          carry, jnp.arange(c.num_layers), mask, shared, head_gates, rope)
      if outputs_at is not None:
        out = jax.tree.map(lambda h: rows_at(h, outputs_at), out)
    return out[1] if c.norm == "pre" else out

  def last_layer_at(self) -> bool:
    """Whether the last layer can compute only the wanted positions: with the xla attention, when no pass
    needs every layer's full output (init, sown intermediates, quantizers' ranges or intercepted matmuls)."""
    return (self.cfg.attention == "xla" and not self.cfg.quantizable and not self.is_initializing()
            and not self.is_mutable_collection("intermediates") and QUANT_RANGES not in self.variables)

  def split_stack(self, layer, carry, mask, shared, head_gates, rope, at):
    """The layer stack as the first L - 1 layers scanned over their slices of the stacked parameters, then
    the last layer at positions `at` only: its queries, attention rows, output projection and FFN for K
    positions instead of S (a [CLS] classifier: about (1 - 2/12) of a layer's matmuls saved). Exact: the last
    layer's other positions reach nothing the caller keeps. Dropout draws its own masks here (the same
    distribution as the full stack's, other values)."""
    c, n = self.cfg, self.cfg.num_layers
    stacked = sh.strip_boxes(self.variables["params"].get("layers", {}))  # none when ALBERT shares every block
    rngs = lambda: {} if self.deterministic else {"dropout": self.make_rng("dropout")}
    gates = (None, None) if head_gates is None else (head_gates[:n - 1], head_gates[n - 1])
    if n > 1:
      first = jax.tree.map(lambda p: p[:n - 1], stacked)
      carry, _ = scan_layers(layer, c, n - 1)(c, self.deterministic, parent=None).apply(
          {"params": first}, carry, jnp.arange(n - 1), mask, shared, gates[0], rope, rngs=rngs())
    last = jax.tree.map(lambda p: p[n - 1], stacked)
    out, _ = layer(c, self.deterministic, parent=None).apply(
        {"params": last}, carry, jnp.int32(n - 1), mask, shared, gates[1], rope, at, rngs=rngs())
    return out


def scan_layers(layer, c: EncoderConfig, length: int):
  """`length` layers under nn.scan: parameters stacked on a leading `layers` axis, dropout keys split per layer."""
  return nn.scan(
      layer,
      variable_axes={"params": 0, "intermediates": 0, QUANT_RANGES: 0},
      split_rngs={"params": True, "dropout": True},
      in_axes=(0, nn.broadcast, nn.broadcast, 0, nn.broadcast),
      length=length,
      metadata_params={nn.PARTITION_NAME: sh.LAYERS},
      unroll=min(layers_per_iteration(c), length),
  )
