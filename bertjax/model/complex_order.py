"""Complex-order embeddings (Wang, Zhao, Lioma, Li, Zhang and Simonsen, ICLR 2020): the `complex_order` position
kind (position-aware complex word embeddings on BERT's real encoder) and the `complex_order` attention kind (the
authors' complex attention over the embedding's real and imaginary parts).

A word j at position pos is the complex vector f(j, pos) = r_j * exp(i * omega_j * pos): the word embedding is its
amplitude r_j, and a second table of the same shape holds each word's frequencies omega_j, initialized as the
authors' code does to 1 / 10000^(2 floor(k / 2) / E) for every word and trained (their classification model; the
initial phase is 0, as there). Positions are counted as that code counts them: descending along the row, S - 1 for
the first token down to 0 for the last (`model.complex_positions=descending`); `ascending` takes the token's own
position (restarting per packed example), as the paper writes it. Shifting a word by n positions multiplies its
embedding by exp(i omega_j n) (the offset property; tests/test_complex_order.py).

The real encoder reads the real part r cos(omega pos) on even dimensions and the imaginary part r sin(omega pos)
on odd ones: the initial frequencies give each pair (2k, 2k + 1) one frequency, so each pair starts as one
complex number's two parts, the way sinusoidal positions pair sin and cos. The position kind alone is the
embedding-only variant; with `model.attention_kind=complex_order` every attention layer is the authors' complex
attention (docs/models.md says what is still left out: their complex FFN and per-part LayerNorm). The authors' dropout on the phase
is not applied (the embeddings' own dropout follows their LayerNorm, as for every position kind).
"""

import jax
import jax.numpy as jnp
from flax import linen as nn

from bertjax.core import sharding as sh
from bertjax.core.config import check
from bertjax.model import kinds
from bertjax.model.dropout import token_dropout
from bertjax.model.layers import Block, dense
from bertjax.model.mha import MHA, attention_bias, context_of, scores_of
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


def modulus_scores(qr, qi, kr, ki):
  """[B, H, Q, K]: |Q K^T| of complex queries and keys [B, S, H, D] given as real and imaginary parts, the product
  taken without a conjugate, as the authors' attention_complex.py does: (Qr Kr - Qi Ki) + i (Qr Ki + Qi Kr)."""
  dot = scores_of  # mha's batched dot, heads first
  square = jnp.square(dot(qr, kr) - dot(qi, ki)) + jnp.square(dot(qr, ki) + dot(qi, kr))
  positive = square > 0  # sqrt's gradient at 0 is infinite: 0 there
  return jnp.where(positive, jnp.sqrt(jnp.where(positive, square, 1.0)), 0.0)


class ComplexAttention(Block):
  """The authors' complex attention on the real encoder's stream read as complex numbers (even dimensions the
  real parts, odd ones the imaginary parts, as the complex_order embedding writes them): one real projection per
  role applied to both parts, softmax(|Q K^T| / sqrt(d_k) + mask) over the real and the imaginary values, the output
  projection on each part; the norm kind adds the residual as for every attention block."""

  @nn.compact
  def __call__(self, x, mask, head_gates=None, positions=None, layer_index=0, at=None):
    """As MultiHeadAttention (xla implementation; `positions` and `at` unused: this kind computes every row)."""
    c = self.cfg
    half, hd = c.hidden_size // 2, c.hidden_size // 2 // c.num_heads
    parts = (x[..., 0::2], x[..., 1::2])
    proj = lambda n: dense(c, half, (c.num_heads, hd), (sh.EMBED, sh.HEADS, sh.KV), n, c.use_bias)
    (qr, qi), (kr, ki), (vr, vi) = (tuple(p(part) for part in parts) for p in (proj("query"), proj("key"), proj("value")))
    probs = jax.nn.softmax(modulus_scores(qr, qi, kr, ki) * hd**-0.5 + mask, axis=-1)
    self.sow("intermediates", "attention_probs", probs)
    probs = token_dropout(c, c.attention_dropout, (2, 3))(probs, deterministic=self.deterministic).astype(c.dtype)
    ctx = [context_of(probs, v) for v in (vr, vi)]
    if head_gates is not None:
      ctx = [part * head_gates.astype(part.dtype)[:, None] for part in ctx]
    output = dense(c, (c.num_heads, hd), half, (sh.HEADS, sh.KV, sh.EMBED), "output", c.use_bias, out=True)
    out = jnp.stack([output(part) for part in ctx], axis=-1).reshape(x.shape)  # real, imaginary interleaved again
    out = token_dropout(c, c.dropout)(out, deterministic=self.deterministic)
    return kinds.of(c, "norm").attention_output(c, x, out)

  @staticmethod
  def init_args(c, x):
    """Arguments that initialize the block alone (ALBERT's shared blocks): an all-zero bias."""
    return (x, jnp.zeros((1, 1, 1, 1), jnp.float32))


@kinds.register("attention", "complex_order")
class ComplexOrderAttention(MHA):
  """The authors' complex attention (xla implementation only) over the stream's (even, odd) pairs."""

  block = ComplexAttention
  computes_rows = False
  fused = False
  hf_family = ""

  def check(self, m):
    check(m.attention not in ("dot_product", "cudnn", "splash"),
          f"model.attention_kind=complex_order takes the modulus of complex scores, which model.attention="
          f"{m.attention} cannot; use --config.model.attention=xla")
    check(m.hidden_size % (2 * m.num_heads) == 0 and not m.head_size,
          f"model.attention_kind=complex_order splits model.hidden_size={m.hidden_size} into real and imaginary "
          f"halves of model.num_heads={m.num_heads} heads; use a hidden size divisible by 2 x heads")
    check(not m.local_window, "model.attention_kind=complex_order attends globally; set --config.model.local_window=0")

  def mask(self, c, groups):
    return attention_bias(groups)

  def forward_flops(self, c, seq_len: int, layer: int) -> float:
    """Four projections of both halves, four score products and two value products per head."""
    half = c.hidden_size // 2
    return 2 * 4 * 2 * half * half + 2 * 6 * seq_len * half
