"""Dropout with a cheaper mask than jax.random.bernoulli, from one of two counter-based generators
(`GENERATORS`, EncoderConfig.dropout_rng): `threefry` (four 16-bit draws per Threefry-2x32 hash, the reference)
or `lowbias32` (a 32-bit keyed integer hash per element, ~8x cheaper on the CPU). Either is a pure function of
(key, position), and masks of a shorter input are cut from the ones drawn at the configured length (so length
buckets keep their randomness)."""

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


# model.dropout_rng's generators (bertjax.model.config resolves `auto` per platform): threefry, the reference
# (jax.random's hash, four 16-bit draws per evaluation), and lowbias32 (docs/cpu.md, "Dropout masks").
GENERATORS = ("threefry", "lowbias32")


def _counters(dims, full_dims):
  """uint32 counters over `dims`: each element's flat index in `full_dims` (each axis at least `dims`'), so the
  counters of a smaller shape are the corner of the full shape's. Built from iotas over every axis, so they
  shard like the array they index."""
  if tuple(full_dims) == tuple(dims):
    return jax.lax.iota(jnp.uint32, math.prod(dims)).reshape(dims)
  strides = [math.prod(full_dims[i + 1:]) for i in range(len(dims))]
  return sum(jax.lax.broadcasted_iota(jnp.uint32, dims, i) * jnp.uint32(stride) for i, stride in enumerate(strides))


def _threefry_mask(k, shape, keep_prob, full_shape):
  """Four 16-bit draws per Threefry-2x32 hash: counters over the leading dimensions and a quarter of the last."""
  *lead, last = shape
  quarter = -(-last // 4)
  counts = _counters((*lead, quarter), (*full_shape[:-1], -(-full_shape[-1] // 4)))
  b0, b1 = _threefry2x32(k[0], k[1], jnp.zeros_like(counts), counts)
  lo = jnp.uint32(0xFFFF)
  lanes = jnp.stack([b0 & lo, b0 >> 16, b1 & lo, b1 >> 16], axis=-1).reshape((*lead, 4 * quarter))
  return lanes[..., :last] < jnp.uint32(round(keep_prob * 2**16))


def _lowbias32(x):
  """Wellons' lowbias32 integer hash (a bijection of uint32 with low avalanche bias: xorshift-multiply x2)."""
  x = x ^ (x >> 16)
  x = x * jnp.uint32(0x7FEB352D)
  x = x ^ (x >> 15)
  x = x * jnp.uint32(0x846CA68B)
  return x ^ (x >> 16)


def _lowbias32_mask(k, shape, keep_prob, full_shape):
  """One 32-bit draw per element: lowbias32(lowbias32(counter * golden + k0) ^ k1) < keep_prob * 2^32. About 18
  integer operations an element against Threefry's ~30 (~120 per hash over its 4 draws, plus their interleaving),
  and purely elementwise, so XLA fuses the whole draw into the op that applies the mask."""
  x = _counters(shape, full_shape) * jnp.uint32(0x9E3779B9) + k[0]  # a Weyl step spreads neighbouring counters
  bits = _lowbias32(_lowbias32(x) ^ k[1])
  return bits < jnp.uint32(min(round(keep_prob * 2**32), 2**32 - 1))


_MASKS = {"threefry": _threefry_mask, "lowbias32": _lowbias32_mask}


def keep_mask(rng, shape, keep_prob: float, full_shape=None, generator: str = "threefry"):
  """Dropout's Bernoulli(keep_prob) mask, a pure function of the key and each element's position.

  `generator` (GENERATORS): `threefry` spends one Threefry-2x32 evaluation (64 bits) on four elements, each
  comparing 16 bits with round(keep_prob * 2^16), so keep_prob is exact to 2^-17 (0.9 -> 0.899994);
  jax.random.bernoulli spends it on one, and the hash was a third of a CPU train step at tiny size.
  `lowbias32` hashes (key, counter) to 32 bits per element (exact to 2^-33). Counters run over the leading
  dimensions, so the mask shards like the activations it masks. `full_shape` (each axis at least `shape`'s):
  the mask is the corner of the one drawn for that shape, computed without drawing the rest (counters keep the
  full shape's strides).
  """
  full_shape = tuple(shape) if full_shape is None else tuple(full_shape)
  return _MASKS[generator](_key_words(rng), tuple(shape), keep_prob, full_shape)


class Dropout(nn.Module):
  """flax.linen.Dropout (same name, rng collection and scaling) with a cheaper mask: `keep_mask` from
  `generator` for threefry keys (at least 4x fewer hash evaluations than jax.random.bernoulli); other key types
  fall back to it. With `length`, the `seq_axes` of the input are drawn as if that long
  (EncoderConfig.dropout_length)."""

  rate: float
  deterministic: bool | None = None
  rng_collection: str = "dropout"
  seq_axes: tuple = ()
  length: int = 0
  generator: str = "threefry"  # GENERATORS (EncoderConfig.dropout_rng)

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
      mask = keep_mask(rng, inputs.shape, keep_prob, full, self.generator)
    else:
      mask = jax.random.bernoulli(rng, p=keep_prob, shape=full)[tuple(slice(n) for n in inputs.shape)]
    return jax.lax.select(mask, inputs / keep_prob, jnp.zeros_like(inputs))


def token_dropout(c: EncoderConfig, rate: float, seq_axes=(1,)) -> Dropout:
  """Dropout of activations with sequence axes ([B, S, ...] hidden states, [B, H, S, S] probabilities),
  drawn at c.dropout_length so that padding to a shorter length keeps the masks of the real positions, by
  c.dropout_rng's generator."""
  return Dropout(rate, seq_axes=tuple(seq_axes), length=c.dropout_length, generator=c.dropout_rng)

