"""The `constituent` attention kind: the Tree Transformer's constituent attention (Wang, Lee and Chen, EMNLP 2019),
transcribed from the authors' code (github.com/yaushian/Tree-Transformer: attention.py `GroupAttention` and
`attention`, models.py `Encoder`).

Before its self-attention, every layer scores each token against its two neighbours (its own LayerNorm, then a
query and a key projection, one head): p_i = softmax over the neighbours i - 1 and i + 1 of q_i . k_j / 256 (the
code's fixed divisor). The link between i and i + 1 is â_i = sqrt(p_{i,i+1} p_{i+1,i} + 1e-9), and the break
probabilities are carried up the stack: a^l = a^{l-1} + (1 - a^{l-1}) â^l, a^0 = 0 (the kind's state, threaded by
bertjax.model.layer). The constituent prior C_{i,j} = prod_{k=i}^{j-1} a_k (i < j, symmetric, from a cumulative
sum of logs) multiplies the attention probabilities after the softmax, one C for every head, rows not
renormalized. Neighbours are only tokens of the same packed example (`groups`), so packed examples equal
separate ones. The code's quirks are kept: C's diagonal is the neighbour matrix's (sqrt(1e-9) at layer 1, carried
up like the links), and off-diagonal entries get + 1e-9. Switches for the paper's reading:
`constituent_scale` (0: divide by the hidden width) and `constituent_renormalize` (rows sum to 1).

Only the xla implementation can multiply the probabilities, so a fused kernel is refused (the kind's `check`) and
`model.attention=auto` runs xla. Every layer sows its break probabilities (`break_probs`, [B, S]: the link between
i and i + 1), which `parse` turns into a tree as the authors' parse.py does.
"""

import jax.numpy as jnp
from flax import linen as nn

from bertjax.core import sharding as sh
from bertjax.core.config import check
from bertjax.model import kinds
from bertjax.model.layers import dense, layer_norm
from bertjax.model.mha import MHA, MultiHeadAttention, attention_bias

EPS = 1e-9  # the code's constant inside the square root, the logarithm and C's off-diagonal
FUSED = ("dot_product", "cudnn", "splash")


def neighbour_probs(q, k, groups, scale: float):
  """(right, left) [B, S]: each token's softmax over its two neighbours of q_i . k_j / scale, for q and k
  [B, S, D]; a neighbour of another packed example (or padding) gets 0, and a token without any gets 0 for both
  (the code's softmax over a fully masked row would spread over the whole row)."""
  same = lambda shift: (jnp.roll(groups, shift, 1) == groups) & (jnp.roll(groups, shift, 1) > 0)
  s = groups.shape[1]
  ok_right = same(-1) & (jnp.arange(s) < s - 1)
  ok_left = same(1) & (jnp.arange(s) > 0)
  dot = lambda shift: jnp.einsum("bsd,bsd->bs", q, jnp.roll(k, shift, 1), preferred_element_type=jnp.float32)
  right, left = dot(-1) / scale, dot(1) / scale
  top = jnp.maximum(jnp.where(ok_right, right, -jnp.inf), jnp.where(ok_left, left, -jnp.inf))
  top = jnp.where(jnp.isfinite(top), top, 0.0)
  e_right = jnp.where(ok_right, jnp.exp(right - top), 0.0)
  e_left = jnp.where(ok_left, jnp.exp(left - top), 0.0)
  total = jnp.maximum(e_right + e_left, jnp.finfo(jnp.float32).tiny)
  return e_right / total, e_left / total


def break_probs(right, left, prior):
  """The layer's links a [B, S] (a_i joins i and i + 1; the last is a padding value) and C's diagonal d [B, S],
  from the neighbour probabilities and the previous layer's prior (state: (C's superdiagonal, its diagonal))."""
  prior_link, prior_diag = prior
  link = jnp.sqrt(right * jnp.roll(left, -1, 1) + EPS)  # p_{i,i+1} p_{i+1,i}
  link = link.at[:, -1].set(jnp.sqrt(EPS))
  diag = jnp.sqrt(jnp.float32(EPS))  # p_{i,i} = 0: a token is not its own neighbour
  return prior_link + (1.0 - prior_link) * link, prior_diag + (1.0 - prior_diag) * diag


def constituent_prior(a, d):
  """C [B, S, S] from the links `a` and the diagonal `d` [B, S]: prod_{k=i}^{j-1} (a_k + 1e-9) + 1e-9 off the
  diagonal (symmetric), d on it. The product is the exponential of a difference of cumulative sums of logs."""
  logs = jnp.log(a + EPS)
  cum = jnp.concatenate([jnp.zeros_like(logs[:, :1]), jnp.cumsum(logs, axis=1)[:, :-1]], axis=1)  # sum_{k<i}
  span = cum[:, None, :] - cum[:, :, None]  # [b, i, j] = sum_{k=i}^{j-1} log(a_k + eps) for j > i
  s = a.shape[1]
  upper = jnp.arange(s)[None, :] > jnp.arange(s)[:, None]
  off = jnp.exp(jnp.where(upper, span, -span)) + EPS
  return jnp.where(jnp.eye(s, dtype=bool), d[:, :, None], off)


class ConstituentAttention(MultiHeadAttention):
  """The neighbour attention and constituent prior, then the `mha` block's attention multiplied by the prior."""

  @nn.compact
  def __call__(self, x, mask, head_gates=None, positions=None, layer_index=0, at=None, state=None):
    """As `MultiHeadAttention`, with `mask` = (bias, groups) and `state` the carried prior; returns (output,
    the state for the next layer)."""
    c = self.cfg
    bias, groups = mask
    h = layer_norm(c, "group_ln")(x).astype(c.dtype)
    proj = lambda n: dense(c, c.hidden_size, c.hidden_size, (sh.EMBED, None), n, c.use_bias)(h)
    scale = c.constituent_scale or float(c.hidden_size)
    right, left = neighbour_probs(proj("group_query"), proj("group_key"), groups, scale)
    a, d = break_probs(right, left, state)
    self.sow("intermediates", "break_probs", a)  # the parser reads them (bertjax.compress.trees)
    prior = constituent_prior(a, d)
    if c.constituent_renormalize:  # C * exp(s) / sum_j C * exp(s) = softmax(s + log C): rows sum to 1
      out = self.attend(x, bias + jnp.log(prior)[:, None], head_gates, positions, layer_index, at)
    else:
      out = self.attend(x, bias, head_gates, positions, layer_index, at, weights=prior)
    return out, (jnp.exp(jnp.log(a + EPS)) + EPS, d)  # what C holds on its superdiagonal and diagonal

  @staticmethod
  def init_args(c, x):
    """Arguments that initialize the block alone (ALBERT's shared blocks)."""
    zeros = jnp.zeros(x.shape[:2], jnp.float32)
    return (x, (jnp.zeros((1, 1, 1, 1), jnp.float32), jnp.ones(x.shape[:2], jnp.int32)), None, None, 0, None,
            (zeros, zeros))


@kinds.register("attention", "constituent")
class Constituent(MHA):
  """The Tree Transformer's constituent attention on BERT's multi-head attention (xla implementation only)."""

  block = ConstituentAttention
  computes_rows = False  # the prior of a row needs every position's links
  fused = False
  hf_family = ""

  def check(self, m):
    super().check(m)
    check(m.attention not in FUSED, f"model.attention_kind=constituent multiplies the attention probabilities by "
          f"the constituent prior, which model.attention={m.attention} cannot; use --config.model.attention=xla")
    check(not m.local_window, "model.attention_kind=constituent attends globally; set --config.model.local_window=0")
    check(m.constituent_scale >= 0, f"model.constituent_scale={m.constituent_scale} must be >= 0 (0: the hidden width)")

  def mask(self, c, groups):
    """The additive bias of the self-attention and the groups, which keep neighbours inside each example."""
    return attention_bias(groups), groups

  def start(self, c, x):
    """a^0 = 0: the prior's superdiagonal and diagonal before the first layer."""
    zeros = jnp.zeros(x.shape[:2], jnp.float32)
    return zeros, zeros

  def forward_flops(self, c, seq_len: int, layer: int) -> float:
    """mha's, plus the neighbour query and key projections (the two neighbour scores are negligible)."""
    return super().forward_flops(c, seq_len, layer) + 2 * 2 * c.hidden_size * c.hidden_size
