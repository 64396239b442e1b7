"""The encoder's numeric building blocks: exact GELU and LayerNorm with hand-written gradients, initializers
carrying logical axis names, and the Dense layer whose matmuls run as one [tokens, in] x [in, out] product.
`Block` is the base of every part that has the encoder's hyperparameters and a dropout switch."""

import functools
import math

import jax
import jax.numpy as jnp
from flax import linen as nn

from bertjax.core import sharding as sh
from bertjax.model.hparams import EncoderConfig

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


ACTIVATIONS = ("gelu", "gelu_new", "relu")


def activation(cfg: EncoderConfig, x):
  """The FFN / MLM-head activation: exact GELU, or its tanh approximation where the reference uses it
  (ALBERT: google-research/albert modeling.py's gelu(); HF's gelu_new), or ReLU (MobileBERT)."""
  if cfg.activation == "gelu_new":
    return nn.gelu(x, approximate=True)
  if cfg.activation == "relu":
    return nn.relu(x)
  return gelu(x)


def kernel_init(cfg: EncoderConfig, names, out: bool = False):
  """Truncated-normal(0.02) initializer (BERT's: cut at 2 std) carrying logical axis names. Under init=modernbert an
  output projection (`out`: attention and FFN outputs, the MLM transform) gets std init_std / sqrt(2 x layers), as
  transformers' ModernBertPreTrainedModel._init_weights ("out"; cutoff factor 2 as well)."""
  std = cfg.init_std / math.sqrt(2 * cfg.num_layers) if out and cfg.init == "modernbert" else cfg.init_std
  return nn.with_logical_partitioning(nn.initializers.truncated_normal(std), names)


def zeros_init(names):
  return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def ones_init(names):
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
    scale = self.param("scale", ones_init(self.names), (x.shape[-1],), jnp.float32)
    if self.use_bias:
      bias = self.param("bias", zeros_init(self.names), (x.shape[-1],), jnp.float32)
    else:
      bias = jnp.zeros_like(scale)
    return _layer_norm(x.astype(jnp.float32), scale, bias, self.epsilon)


def layer_norm(cfg: EncoderConfig, name: str, names=(sh.EMBED,)) -> LayerNorm:
  """BERT's LayerNorm (eps from the config) in float32; without a bias where the config has none."""
  return LayerNorm(cfg.layer_norm_eps, tuple(names), cfg.use_bias, name=name)


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
    kernel = self.param("kernel", kernel_init(self.cfg, self.names, self.out), self.in_shape + self.out_shape)
    bias = self.param("bias", zeros_init(self.names[n_in:]), self.out_shape) if self.use_bias else None
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
  (the encoder's own layers pass cfg.use_bias; task heads keep theirs). `out`: an output projection (see kernel_init)."""
  as_tuple = lambda s: tuple(s) if isinstance(s, (tuple, list)) else (s,)
  return Dense(cfg, as_tuple(in_shape), as_tuple(out_shape), tuple(names), bias, out, name=name)



def rows_at(x, at):
  """x [B, S, ...] at positions `at` [B, K]: [B, K, ...]."""
  return jnp.take_along_axis(x, at.reshape(at.shape + (1,) * (x.ndim - 2)), axis=1)



class Block(nn.Module):
  """A part of the encoder: its hyperparameters, and whether dropout is off (inference, eval)."""

  cfg: EncoderConfig
  deterministic: bool = True

