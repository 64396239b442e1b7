"""The `tree` attention kind: tree-structured attention with hierarchical accumulation over given constituency parses
(Nguyen, Joty, Hoi and Socher, ICLR 2020), transcribed from the first author's code (github.com/nxphi47/tree_transformer
@8ac39e4, src/modules/nstack_merge_tree_attention.py: `MergeWeightMask.build_mask_leaves_subtree`,
`MergeHierarchicalEmbedding`, `MergeStackNodesOnValueAttention` with `wnstack_up_norm=mean`, `wnstack_norm=mean`).

A row holds a tree's leaves (its word pieces, between [CLS] and [SEP]) and then its nodes (bertjax.data.trees); each
node position carries the inclusive row positions of its span's first and last leaf (`node_first`, `node_last`; -1
at every other position), which reach the kind through `groups` (bertjax.model.mha.encoder_groups). Then, in every
layer:
- Subtree mask: a leaf (any position that is not a node: [CLS] and [SEP] too) attends to the leaves of its example
  and to no node; node x attends to the leaves inside its span and to the nodes y whose span lies inside x's, itself
  included. The code finds those nodes by their order (bottom-up, y <= x with overlapping spans); here span
  containment decides, which needs no order (a tree's nodes have distinct spans once unary chains are collapsed,
  as bertjax.data.trees and the authors' preprocessing do).
- Hierarchical embeddings: for leaf i inside node x, a horizontal index h = i - first(x) + 1 (the code's cumulative
  count of x's leaves up to i) and a vertical index v = depth of x below the root (root = 1; the code's cumulative
  count over the nodes in top-down order), clamped at model.tree_max_horiz and model.tree_max_vert; E[i, x] =
  [e(h); e(v)] interleaved (the code's cat of unsqueezed halves), head_dim wide, shared by the heads, one table of
  1 + max_horiz + 1 + max_vert rows per layer (v offset by 1 + max_horiz; the code's nstack_hier_embed_share=False),
  initialized N(0, 1) as the code's nn.Embedding is.
- Hierarchical accumulation on node values: S[i, x] = (v_i + sum over the nodes y on the path from i up to x of
  (v_y + E[i, y])) / (number of those nodes), for i inside x (upmean: the leaf's own value is in the sum, not in the
  count); node x's value is sum_i w_i S[i, x] / |span(x)| (mean), w = Linear(hidden -> heads)(layer input) with a
  bias and no activation. Leaves keep their values; the attention scores are plain dot products with every key.

`model.tree_vertical=path` is the paper's reading as we have it (unverified, the spec sheet's recollection: the
nodes from the leaf up to x); the default `depth` is the code's. Only the xla implementation takes the dense
subtree mask, so a fused kernel is refused (`check`, and model.config.resolve_attention runs auto as xla). The
accumulation builds [B, S, S, head_dim] arrays (the code's n x m x d per head, shared here by the heads): memory
grows with the square of the row.
"""

import jax.numpy as jnp
from flax import linen as nn

from bertjax.core import sharding as sh
from bertjax.core.config import check
from bertjax.model import kinds
from bertjax.model.layers import dense
from bertjax.model.mha import MHA, MultiHeadAttention

FUSED = ("dot_product", "cudnn", "splash")
VERTICAL = ("depth", "path")


def rows_of(groups):
  """(groups, node_first, node_last) [B, S] from what the encoder was handed: that tuple, or groups alone (plain
  text: no node, every position -1)."""
  if isinstance(groups, (tuple, list)):
    return tuple(groups)
  none = jnp.full(groups.shape, -1, jnp.int32)
  return groups, none, none


def relations(groups, first, last):
  """(node [B, S], inside [B, S, S], contains [B, S, S]) of tree rows: node marks node positions; inside[i, x]: leaf
  i (a real position that is no node) lies in node x's span; contains[y, x]: node y's span lies in node x's (y = x
  too). Spans are row positions, so nothing relates positions of two packed examples."""
  pos = jnp.arange(groups.shape[1])
  node = first >= 0
  leaf = ~node & (groups > 0)
  within = (pos[None, :, None] >= first[:, None, :]) & (pos[None, :, None] <= last[:, None, :])
  inside = leaf[:, :, None] & node[:, None, :] & within
  contains = (node[:, :, None] & node[:, None, :] & (first[:, :, None] >= first[:, None, :])
              & (last[:, :, None] <= last[:, None, :]))
  return node, inside, contains


def subtree_allowed(groups, node, inside, contains):
  """[B, query, key] True where the subtree mask lets a query see a key (leaves: the leaves of their example; node
  x: the leaves inside its span and the nodes inside it)."""
  same = (groups[:, :, None] == groups[:, None, :]) & (groups[:, None, :] > 0)
  as_node = jnp.swapaxes(inside | contains, 1, 2)
  return jnp.where(node[:, :, None], as_node, same & ~node[:, None, :])


def hierarchical_indices(first, last, inside, contains, max_horiz: int, max_vert: int, vertical: str = "depth"):
  """(horizontal, vertical) table rows [B, S(leaf i), S(node x)] of the hierarchical embeddings, clamped, the
  vertical ones offset by 1 + max_horiz (one table holds both). Entries where i is not inside x are masked
  downstream."""
  pos = jnp.arange(first.shape[1])[None, :, None]
  horiz = jnp.clip(pos - first[:, None, :] + 1, 0, (last - first + 1)[:, None, :])
  if vertical == "depth":  # nodes whose span holds x's: x's depth, root = 1
    vert = jnp.broadcast_to(contains.sum(2)[:, None, :], inside.shape)
  else:  # nodes on the path from leaf i up to x
    vert = jnp.einsum("biy,byx->bix", inside.astype(jnp.int32), contains.astype(jnp.int32))
  return jnp.minimum(horiz, max_horiz), jnp.minimum(vert, max_vert) + 1 + max_horiz


def hierarchical_embedding(table, horiz, vert):
  """E [..., head_dim]: the table's rows at the horizontal and vertical indices, interleaved (h0, v0, h1, v1, ...)."""
  e = jnp.stack([jnp.take(table, horiz, axis=0), jnp.take(table, vert, axis=0)], axis=-1)
  return e.reshape(*horiz.shape, -1)


def accumulate(v, w, emb, node, inside, contains):
  """Values after hierarchical accumulation [B, S, heads, head_dim]: leaves as `v`, node x as
  sum_i w_i S[i, x] / |span(x)| (module docstring), for projected values v [B, S, heads, d], weights w [B, S, heads]
  and hierarchical embeddings emb [B, S, S, d]. Computed without the [B, heads, S, S, d] stack of S: the weights
  of the leaves' and the nodes' values, and the embeddings summed along each path, are contracted apart."""
  f32 = jnp.float32
  inside_f, contains_f = inside.astype(f32), contains.astype(f32)
  count = jnp.einsum("biy,byx->bix", inside_f, contains_f)  # nodes on the path from leaf i up to x
  span = inside_f.sum(1)  # [B, x]
  share = inside_f / jnp.maximum(count, 1.0) / jnp.maximum(span, 1.0)[:, None, :]
  a = jnp.swapaxes(w.astype(f32), 1, 2)[..., None] * share[:, None]  # [B, heads, i, x]
  vf = v.astype(f32)
  leaves = jnp.einsum("bhix,bihd->bxhd", a, vf)
  through = jnp.einsum("bhix,biy->bhyx", a, inside_f) * contains_f[:, None]  # node y's weight in node x
  nodes = jnp.einsum("bhyx,byhd->bxhd", through, vf)
  along = jnp.einsum("biyd,byx->bixd", emb.astype(f32) * inside_f[..., None], contains_f)  # sum of E[i, y] to x
  embedded = jnp.einsum("bhix,bixd->bxhd", a, along)
  return jnp.where(node[:, :, None, None], leaves + nodes + embedded, vf).astype(v.dtype)


class TreeAttention(MultiHeadAttention):
  """Multi-head attention under the subtree mask, its node values hierarchically accumulated."""

  @nn.compact
  def __call__(self, x, mask, head_gates=None, positions=None, layer_index=0, at=None):
    """As `MultiHeadAttention`, with `mask` = (the subtree bias [B, 1, S, S], the rows' relations and indices)."""
    c = self.cfg
    bias, (node, inside, contains, horiz, vert) = mask
    w = dense(c, c.hidden_size, c.num_heads, (sh.EMBED, sh.HEADS), "accumulation_weight")(x)
    rows = 1 + c.tree_max_horiz + 1 + c.tree_max_vert
    table = self.param("hierarchical_embedding", nn.with_logical_partitioning(nn.initializers.normal(1.0), (None, sh.KV)),
                       (rows, c.head_dim // 2))
    emb = hierarchical_embedding(table, horiz, vert)
    values = lambda v: accumulate(v, w, emb, node, inside, contains)
    return self.attend(x, bias, head_gates, positions, layer_index, at, values=values)

  @staticmethod
  def init_args(c, x):
    """Arguments that initialize the block alone (ALBERT's shared blocks): one leaf, no node."""
    return (x, kinds.get("attention", "tree").mask(c, jnp.ones(x.shape[:2], jnp.int32)))


@kinds.register("attention", "tree")
class Tree(MHA):
  """Tree-structured attention on given parses (xla implementation only); rows carry node spans."""

  block = TreeAttention
  computes_rows = True  # queries at some rows only: keys and (accumulated) values still come from every position
  fused = False
  hf_family = ""
  inputs = ("node_first", "node_last")

  def check(self, m):
    super().check(m)
    check(m.attention not in FUSED, f"model.attention_kind=tree masks each node's attention to its subtree, which "
          f"model.attention={m.attention} cannot; use --config.model.attention=xla")
    check(not m.local_window, "model.attention_kind=tree attends within subtrees; set --config.model.local_window=0")
    check(m.tree_vertical in VERTICAL, f"model.tree_vertical={m.tree_vertical!r}; use depth or path")
    check(m.tree_max_horiz >= 1 and m.tree_max_vert >= 1,
          f"model.tree_max_horiz={m.tree_max_horiz} and model.tree_max_vert={m.tree_max_vert} must be >= 1")
    head = m.head_size or m.hidden_size // m.num_heads
    check(head % 2 == 0, f"model.attention_kind=tree splits each head's {head} channels between the horizontal and "
          "vertical embeddings; use an even head width")

  def mask(self, c, groups):
    """(the subtree bias [B, 1, S, S], (node, inside, contains, horizontal and vertical indices)): made once from
    the rows, shared by every layer."""
    groups, first, last = rows_of(groups)
    node, inside, contains = relations(groups, first, last)
    bias = jnp.where(subtree_allowed(groups, node, inside, contains), 0.0, -1e9).astype(jnp.float32)[:, None]
    indices = hierarchical_indices(first, last, inside, contains, c.tree_max_horiz, c.tree_max_vert, c.tree_vertical)
    return bias, (node, inside, contains, *indices)

  def forward_flops(self, c, seq_len: int, layer: int) -> float:
    """mha's, plus the accumulation weights (H -> heads) and the accumulation's contractions per token (the
    embeddings summed along paths: seq_len^2 x head_dim; the leaves' and nodes' value mixes: 2 x seq_len x inner)."""
    inner = c.num_heads * c.head_dim
    return (super().forward_flops(c, seq_len, layer) + 2 * c.hidden_size * c.num_heads
            + 2 * seq_len * seq_len * c.head_dim + 2 * 2 * 2 * seq_len * inner)
