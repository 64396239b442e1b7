"""Dropout with a cheaper mask than jax.random.bernoulli: four 16-bit draws per Threefry hash, and masks of a
shorter input cut from the ones drawn at the configured length (so length buckets keep their randomness)."""

import math

import jax
import jax.numpy as jnp
from flax import linen as nn

from bertjax.model.hparams import EncoderConfig

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

