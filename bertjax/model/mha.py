"""The `mha` attention kind: multi-head scaled dot-product self-attention (BERT's), with its implementations
(bertjax.model.attention: xla, dot_product, cudnn, splash) and ModernBERT's per-layer pattern of global and
local (sliding-window) layers.

The kind answers what the encoder asks an attention kind: the block (a flax module, `block`), what every layer's
attention takes besides its input (`mask`, from the rows' groups), whether a layer can compute only some query
positions (`computes_rows`), and its FLOPs per token (`forward_flops`: a local layer counts the keys inside its
window, not the whole row).
"""

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from bertjax.core import sharding as sh
from bertjax.core.config import check
from bertjax.model import attention as attention_lib
from bertjax.model import kinds
from bertjax.model.dropout import token_dropout
from bertjax.model.layers import Block, dense, rows_at

LAYER_TYPES = ("global", "local")


class MultiHeadAttention(Block):
  """Multi-head self-attention with the residual and norm its norm kind places (post: LN(x + attention);
  pre: the block's output alone, the layer adds it to the residual stream)."""

  @nn.compact
  def __call__(self, x, mask, head_gates=None, positions=None, layer_index=0, at=None):
    """`x`: the norm kind's attention input [B, S, E]. `mask`: what `MHA.mask` made (the additive bias
    [B, 1, S, S] for the xla implementation, the groups [B, S] for a fused one). `head_gates`: optional [heads]
    of this layer (bertjax.compress.prune). `positions`: the position kind's tables for the encoder. `layer_index`:
    this layer's index (traced inside the layer scan). `at`: optional [B, K] positions, the only queries computed
    (xla implementation): the output is [B, K, E], keys and values still come from every position."""
    return self.attend(x, mask, head_gates, positions, layer_index, at)

  def attend(self, x, mask, head_gates, positions, layer_index, at, weights=None, values=None):
    """The block's computation, called inside a compact `__call__` (this one, or a kind's that subclasses it).
    `weights`: optional [B, S, S] that multiplies every head's attention probabilities after the softmax (xla
    implementation; the Tree Transformer's constituent prior, bertjax.model.constituent). `values`: multi_head's."""
    xq, out = multi_head(self, self.cfg, x, mask, head_gates, positions, layer_index, at, weights, values)
    return kinds.of(self.cfg, "norm").attention_output(self.cfg, xq, out)

  @staticmethod
  def init_args(c, x):
    """Arguments that initialize the block alone (ALBERT's shared blocks): an all-zero bias."""
    return (x, jnp.zeros((1, 1, 1, 1), jnp.float32))


def multi_head(module, c, x, mask, head_gates=None, positions=None, layer_index=0, at=None, weights=None,
               values=None):
  """Multi-head attention of `x` [B, S, c.hidden_size] as `MultiHeadAttention` computes it, up to its output
  projection and dropout, with its parameters (query, key, value, output) made in the calling module's scope.
  Returns (the residual input at the computed rows, the block's output before residual and norm). The arguments are
  MultiHeadAttention's (`weights`: MultiHeadAttention.attend's); `c` is the width the heads see (bertjax.model.lsra
  runs it on half the channels). `values`: optional function of the projected values [B, S, heads, head_dim] that
  returns the values the probabilities mix (bertjax.model.tree_attention's hierarchical accumulation)."""
  local = layer_is_local(c, layer_index)
  position = kinds.of(c, "position")
  proj = lambda n: dense(c, c.hidden_size, (c.num_heads, c.head_dim), (sh.EMBED, sh.HEADS, sh.KV), n, c.use_bias)
  xq = x if at is None else rows_at(x, at)
  q, k, v = proj("query")(xq), proj("key")(x), proj("value")(x)
  if values is not None:
    v = values(v)
  q, k = position.rotate(q, k, position.for_layer(positions, local), at)
  if c.attention == "xla":
    if local is not False:  # keys further than the half window away are masked on local layers
      mask = mask + attention_lib.window_bias(x.shape[1], c.half_window, local)
    if at is not None:  # the queries' rows of the [B, 1, S, S] bias
      mask = jnp.take_along_axis(mask, at[:, None, :, None], axis=2)
    # Scores, mask and softmax in float32: bf16 softmax loses the small probabilities.
    probs = jax.nn.softmax(scores_of(q, k) * c.head_dim**-0.5 + mask, axis=-1)
    if weights is not None:  # one [B, S, S] shared by every head, rows not renormalized
      probs = probs * weights[:, None]
    # Kept only when the caller asks for the "intermediates" collection (inference's attention maps);
    # otherwise sow does nothing.
    module.sow("intermediates", "attention_probs", probs)
    probs = token_dropout(c, c.attention_dropout, (2, 3))(probs, deterministic=module.deterministic)
    ctx = context_of(probs.astype(c.dtype), v)
  else:  # a fused kernel: no [B, H, S, S] array, no attention dropout (config validation sees to it)
    assert at is None, "query positions need the xla implementation (Encoder falls back to every position)"
    assert weights is None, "probability weights need the xla implementation (the kind's check refuses others)"
    ctx = attention_lib.fused(c.attention, q, k, v, mask, c.head_dim**-0.5, local=local,
                              half_window=c.half_window).astype(c.dtype)
  if head_gates is not None:  # 0 removes a head exactly (its context never reaches the output projection)
    ctx = ctx * head_gates.astype(ctx.dtype)[:, None]
  out = dense(c, (c.num_heads, c.head_dim), c.hidden_size, (sh.HEADS, sh.KV, sh.EMBED), "output", c.use_bias,
              out=True)(ctx)
  out = token_dropout(c, c.dropout)(out, deterministic=module.deterministic)
  return xq, out


def scores_of(q, k):
  """Attention scores [B, heads, Q, K] in float32 of queries [B, Q, heads, head_dim] and keys [B, K, heads,
  head_dim]. The operands go heads-first ([B, heads, S, head_dim]) before the batched dot: XLA:CPU otherwise
  lays the keys out as [B, heads, head_dim, K], a slower copy, and the attention forward ran 1.5x slower
  (docs/cpu.md, "Attention layout"); elsewhere XLA puts batch dimensions first anyway."""
  return jnp.einsum("bhqd,bhkd->bhqk", heads_first(q), heads_first(k), preferred_element_type=jnp.float32)


def context_of(probs, v):
  """The values [B, K, heads, head_dim] mixed by the probabilities [B, heads, Q, K]: [B, Q, heads, head_dim],
  computed heads-first as `scores_of`'s dot."""
  return heads_first(jnp.einsum("bhqk,bhkd->bhqd", probs, heads_first(v)))


def heads_first(x):
  """[B, S, heads, head_dim] <-> [B, heads, S, head_dim] (its own inverse)."""
  return jnp.swapaxes(x, 1, 2)


def layer_is_local(c, layer_index):
  """Whether a layer uses sliding-window attention: a Python bool when every layer is alike, else a traced
  bool read from the per-layer pattern at the scanned layer index."""
  if not any(c.local_layers):
    return False
  if all(c.local_layers):
    return True
  return jnp.asarray(c.local_layers, bool)[layer_index]


def attention_bias(groups):
  """Additive attention bias [B, 1, S, S]: a token attends to tokens of its own nonzero group.

  `groups` is [B, S] int: 0 for padding, and for packed inputs a distinct id per packed example, so that
  attention never crosses examples; an unpacked input passes its padding mask (1 = real token).
  """
  allowed = (groups[:, :, None] == groups[:, None, :]) & (groups[:, None, :] > 0)
  return jnp.where(allowed, 0.0, -1e9).astype(jnp.float32)[:, None]


def keys_per_query(seq_len: int, half_window: int) -> float:
  """Mean number of keys a query of a sliding-window layer sees over a row of `seq_len` (|q - k| <= half_window,
  fewer at the row's ends)."""
  q = np.arange(seq_len)
  return float((np.minimum(q + half_window, seq_len - 1) - np.maximum(q - half_window, 0) + 1).mean())


def encoder_groups(c, groups, inputs=None):
  """What a model hands the encoder as `groups`: the rows' groups [B, S], or for an attention kind that reads more
  of the rows (`AttentionKind.inputs`, e.g. the tree kind's node spans) the tuple (groups, those arrays of the
  mapping `inputs`, a batch); without them (plain text, inference, init) the groups alone."""
  names = kinds.of(c, "attention").inputs
  given = names and inputs is not None and all(k in inputs for k in names)
  return (groups, *(inputs[k] for k in names)) if given else groups


class AttentionKind(kinds.Kind):
  """What an attention kind answers (its defaults: a kind with no state that computes every row and lets
  model.attention pick any implementation). `block`: the flax module of a layer's attention, called as
  MultiHeadAttention is; `mask(c, groups)`, what every layer's block takes besides its input; `forward_flops`."""

  block = None
  computes_rows = False  # whether the block can compute only some query rows (Encoder.split_stack)
  fused = True  # the fused implementations can run it (False: model.attention=auto resolves to xla)
  # Batch arrays [B, S] besides `groups` that `mask` reads (encoder_groups hands them over): none for every kind
  # but tree (node_first, node_last).
  inputs: tuple = ()

  def start(self, c, x):
    """The state this kind carries up the layer stack, from the encoder's input `x` [B, S, H]; None: none
    (every built-in kind but constituent). A kind with state gets it as its block's last argument, and its block
    returns (output, the state for the next layer); bertjax.model.layer threads it without asking which kind."""
    return None

  def mask(self, c, groups):
    """What every layer's attention block takes besides its input, from the rows' groups [B, S]."""
    raise NotImplementedError

  def layers_per_step(self, c) -> int:
    """Consecutive layers one step of the layer scan runs, each with parameters of its own: 1 (every layer
    alike), or a per-layer pattern's period (bertjax.model.per_layer)."""
    return 1

  def layer_kind(self, c, index: int, mask):
    """(the config, the mask) that layer `index` (a Python int) runs its attention with, for a stack that runs its
    layers one by one (bertjax.model.reversible): the layer's block is then that config's kind's. Default: (c, mask)
    (every layer is this kind); a per-layer pattern answers the layer's kind's."""
    return c, mask

  def scan_unit(self, c, layer):
    """The module one step of the layer scan runs, from the layer kind's module `layer`: itself when
    layers_per_step is 1."""
    return layer

  def forward_flops(self, c, seq_len: int, layer: int) -> float:
    """Forward matmul FLOPs per token of layer `layer`'s attention."""
    raise NotImplementedError


@kinds.register("attention", "mha")
class MHA(AttentionKind):
  """Multi-head scaled dot-product self-attention, global or sliding-window per layer."""

  block = MultiHeadAttention
  computes_rows = True  # the xla implementation computes only the queries asked for (Encoder.split_stack)

  def check(self, m):
    check(not m.causal, "model.causal=True masks later keys in the local and lsh attention kinds only; "
          f"model.attention_kind={m.attention_kind} attends both ways: set --config.model.causal=False")
    check(m.local_window >= 0 and m.global_every >= 1,
          f"model.local_window={m.local_window} must be >= 0 and model.global_every={m.global_every} >= 1")
    if m.layer_types:
      types = [t.strip() for t in m.layer_types.split(",")]
      bad = [t for t in types if t not in LAYER_TYPES]
      check(not bad, f"model.layer_types has {bad[0]!r}; use a comma-separated list of global and local")
      check(len(types) == m.num_layers, f"model.layer_types names {len(types)} layers but model.num_layers="
            f"{m.num_layers}; give one type per layer")
      check(m.local_window > 0 or "local" not in types,
            "model.layer_types has local layers but model.local_window=0; set --config.model.local_window")

  def mask(self, c, groups):
    """What every layer's attention takes: the additive bias for the xla implementation, the groups themselves
    (read as segment ids) for a fused kernel."""
    return attention_bias(groups) if c.attention == "xla" else groups

  def forward_flops(self, c, seq_len: int, layer: int) -> float:
    """Forward matmul FLOPs per token of layer `layer`'s attention: the four projections, then scores and
    values over the keys a query sees (its window on a local layer)."""
    inner = c.num_heads * c.head_dim
    local = bool(c.local_layers) and c.local_layers[layer]
    keys = keys_per_query(seq_len, c.half_window) if local else seq_len
    return 2 * 4 * c.hidden_size * inner + 2 * 2 * keys * inner
