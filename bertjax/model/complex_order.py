"""The `complex_order` position kind: position-aware complex word embeddings (Wang, Zhao, Lioma, Li, Zhang and
Simonsen, ICLR 2020), as an embedding on BERT's real encoder.

A word j at position pos is the complex vector f(j, pos) = r_j * exp(i * omega_j * pos): the word embedding is its
amplitude r_j, and a second table of the same shape holds each word's frequencies omega_j, initialized as the
authors' code does to 1 / 10000^(2 floor(k / 2) / E) for every word and trained (their classification model; the
initial phase is 0, as there). Positions are counted as that code counts them: descending along the row, S - 1 for
the first token down to 0 for the last (`model.complex_positions=descending`); `ascending` takes the token's own
position (restarting per packed example), as the paper writes it. Shifting a word by n positions multiplies its
embedding by exp(i omega_j n) (the offset property; tests/test_complex_order.py).

The real encoder reads the real part r cos(omega pos) on even dimensions and the imaginary part r sin(omega pos)
on odd ones: the initial frequencies give each pair (2k, 2k + 1) one frequency, so each pair starts as one
complex number's two parts, the way sinusoidal positions pair sin and cos. This embedding-only variant is not the
paper's model, whose layers are complex (docs/models.md says what is left out). The authors' dropout on the phase
is not applied (the embeddings' own dropout follows their LayerNorm, as for every position kind).
"""

import jax.numpy as jnp
from flax import linen as nn

from bertjax.core import sharding as sh
from bertjax.core.config import check
from bertjax.model import kinds
from bertjax.model.positions import PositionKind

POSITIONS = ("descending", "ascending")


def initial_frequencies(key, shape, dtype=jnp.float32):
  """[vocab, E]: every word's frequencies 1 / 10000^(2 floor(k / 2) / E), as the authors' sinusoid table."""
  del key
  k = jnp.arange(shape[1])
  return jnp.broadcast_to(1.0 / jnp.power(10000.0, 2 * (k // 2) / shape[1]), shape).astype(dtype)


def complex_embedding(amplitude, frequency, pos):
  """(real, imaginary) parts of r * exp(i * omega * pos) for amplitudes and frequencies [..., S, E] and
  positions [..., S]."""
  phase = frequency * pos[..., None]
  return amplitude * jnp.cos(phase), amplitude * jnp.sin(phase)


def positions(c, shape, position_ids):
  """[1 or B, S] float positions as `model.complex_positions` counts them."""
  if c.complex_positions == "descending":
    return jnp.arange(shape[1] - 1, -1, -1, dtype=jnp.float32)[None]
  if position_ids is None:
    return jnp.arange(shape[1], dtype=jnp.float32)[None]
  return position_ids.astype(jnp.float32)


@kinds.register("position", "complex_order")
class ComplexOrder(PositionKind):
  """Word embeddings as amplitudes and a per-word frequency table; the real encoder reads both parts."""

  hf_family = ""

  def check(self, m):
    check(m.complex_positions in POSITIONS,
          f"model.complex_positions={m.complex_positions!r}; use one of {', '.join(POSITIONS)}")
    check((m.embedding_size or m.hidden_size) % 2 == 0,
          "model.position=complex_order pairs the embedding's dimensions; use an even embedding width")

  def table(self, module, c):
    """The frequencies [vocab, E] (parameter `frequency` of the embeddings)."""
    init = nn.with_logical_partitioning(initial_frequencies, (sh.VOCAB, sh.EMBED))
    return module.param("frequency", init, (c.vocab_size, c.embedding_size))

  def add(self, c, table, x, input_ids, position_ids):
    real, imag = complex_embedding(x, jnp.take(table, input_ids, axis=0), positions(c, x.shape, position_ids))
    even = jnp.arange(x.shape[-1]) % 2 == 0
    return jnp.where(even, real, imag).astype(x.dtype)
