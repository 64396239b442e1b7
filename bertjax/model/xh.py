"""Transformer-XH's extra hop (Zhao, Xiong, Rosset, Song, Bennett, Tiwary, ICLR 2020): after each layer from
`HopConfig.from_layer` on, every passage's [CLS] state attends over the [CLS] states of the passages linked to it,
and the result replaces that [CLS] state before the next layer, as the authors' code does
(github.com/microsoft/Transformer-XH @953d8d4, transformer-xh/model/model.py: `GraphAttention`,
`TransformerXHEncoder.forward`).

A graph is a group of rows: inputs [G, N, S] are flattened to G * N rows, one passage a row, padded to N nodes.
`links[g, v, u] = 1` when passage u links to passage v: the hyperlink's start u and end v are the edge u -> v of
the code's DGL graph (data/hotpotqa.py), along which messages flow, so v's [CLS] hears from u. Padding nodes have
no links, so neither padding nor the other graphs of a batch reach a graph's nodes.

Two forms (`HopConfig.form`):
- `gat` (default, the released code's DGL graph attention): c = [CLS] [N, H, D] split into the heads; z = c W (one
  D x D matrix shared by the heads, no bias); e(u -> v) = LeakyReLU_0.2(a_l . z_u + a_r . z_v) per head, softmax
  over v's in-links; g_v = ReLU(flatten(sum_u alpha_uv z_u + c_v W_res)); new [CLS] = Linear_2E->E([g_v; c_v]),
  a separate set of weights for each hop layer. The code builds feature and attention dropout (0.6) but never
  applies them; neither does this.
- `dot` (the paper's equations, no code to compare with): h_v = sum_u softmax_u(q_v . k_u / sqrt(D)) v_u per head
  over v's in-links (q, k, v linear maps of [CLS]); new [CLS] = Linear_2E->E([c_v; h_v]).

A node no passage links to keeps its [CLS] state (`isolated=keep`, the default): what the code gives such a node
depends on the DGL version it runs under (its setup.py pins none), and keeping it makes a graph without links the
plain encoder. `isolated=merge` runs the hop with an empty message instead (DGL's zero fill for nodes without
messages), as the code does on a DGL that fills zeros.

The hop runs inside the encoder's layer scan (`HopEncoder`): each layer is followed by a `lax.cond` on whether
its index is a hop layer. The hop's parameters come in stacked [hops, ...] from outside the encoder's scope, so
the pretrained encoder's parameters are exactly a plain encoder's.
"""

import dataclasses
import math

import jax
import jax.numpy as jnp
from flax import linen as nn

from bertjax.core.errors import UserError
from bertjax.model import kinds
from bertjax.model.encoder import Encoder, remat, scan_layers
from bertjax.model.hparams import EncoderConfig
from bertjax.model.layer import Layer

FORMS = ("gat", "dot")
ISOLATED = ("keep", "merge")
LEAKY_SLOPE = 0.2  # GraphAttention(alpha=0.2)
XAVIER_GAIN = 1.414  # GraphAttention: nn.init.xavier_normal_(..., gain=1.414) on fc, attn_l, attn_r, res_fc
MERGE_STD = 0.02  # TransformerXHEncoder: linear_layer{1,2,3}.weight.normal_(std=config.initializer_range)


@dataclasses.dataclass(frozen=True)
class HopConfig:
  """The extra hop's settings: `from_layer`, the 0-based index of the first layer a hop follows (the code's
  gnn_layer: 9 of 12, hops after layers 9, 10 and 11); `form` gat | dot; `heads` (0: the encoder's);
  `isolated` keep | merge (what a node without in-links gets)."""

  from_layer: int = 0
  form: str = "gat"
  heads: int = 0
  isolated: str = "keep"


def check(c: EncoderConfig, hop: HopConfig) -> None:
  """One-line errors for hop settings this encoder cannot run."""
  if hop.form not in FORMS:
    raise UserError(f"xh.form={hop.form!r}; use gat (the released code's graph attention) or dot (the paper's)")
  if hop.isolated not in ISOLATED:
    raise UserError(f"xh.isolated={hop.isolated!r}; use keep or merge")
  if not 0 <= hop.from_layer < c.num_layers:
    raise UserError(f"xh.from_layer={hop.from_layer} must name one of the encoder's {c.num_layers} layers "
                    f"(0..{c.num_layers - 1}; the code's 9 of 12 hops after the last three)")
  if c.hidden_size % heads_of(c, hop):
    raise UserError(f"xh.heads={heads_of(c, hop)} must divide the hidden size {c.hidden_size}")
  if kinds.of(c, "layer").module is not Layer:
    raise UserError(f"extra-hop layers follow the bert layer kind; this model's is model.layer={c.layer}")
  marker = object()
  if kinds.of(c, "norm").start(marker) is not marker:
    raise UserError(f"extra-hop layers write [CLS] back into the layer stream, which model.norm={c.norm} carries "
                    "with its norm; they run on post-norm encoders (BERT's, as the code's)")


def heads_of(c: EncoderConfig, hop: HopConfig) -> int:
  """The hop's heads: HopConfig.heads, or the encoder's (the code: 12 heads of 64 over BERT-base's 768)."""
  return hop.heads or c.num_heads


def _xavier(shape_of_torch_weight):
  """torch.nn.init.xavier_normal_(gain=XAVIER_GAIN) for a torch tensor of that shape (fans as torch counts them)."""
  receptive = math.prod(shape_of_torch_weight[2:])
  fan_in, fan_out = shape_of_torch_weight[1] * receptive, shape_of_torch_weight[0] * receptive
  return XAVIER_GAIN * math.sqrt(2.0 / (fan_in + fan_out))


def param_shapes(c: EncoderConfig, hop: HopConfig) -> dict:
  """name -> (shape stacked over the hop layers, initializer) of the hop's parameters."""
  n, e, h = c.num_layers - hop.from_layer, c.hidden_size, heads_of(c, hop)
  d = e // h
  normal = lambda std: nn.initializers.normal(std)
  bound = 1 / math.sqrt(2 * e)  # torch nn.Linear's default bias init, U(-1/sqrt(fan_in), 1/sqrt(fan_in))
  merge = dict(merge_kernel=((n, 2 * e, e), normal(MERGE_STD)),
               merge_bias=((n, e), lambda k, s, dt=jnp.float32: jax.random.uniform(k, s, dt, -bound, bound)))
  if hop.form == "gat":  # kernels as [in, out]: x @ kernel is torch's x @ weight.T
    return dict(fc=((n, d, d), normal(_xavier((d, d)))), attn_l=((n, h, d), normal(_xavier((1, h, d)))),
                attn_r=((n, h, d), normal(_xavier((1, h, d)))), res_fc=((n, d, d), normal(_xavier((d, d)))), **merge)
  dense = lambda: ((n, e, e), nn.initializers.truncated_normal(c.init_std))
  bias = lambda: ((n, e), nn.initializers.zeros_init())
  return dict(query_kernel=dense(), query_bias=bias(), key_kernel=dense(), key_bias=bias(), value_kernel=dense(),
              value_bias=bias(), **merge)


class Hops(nn.Module):
  """The hop layers' parameters, stacked on a leading axis (one entry per hop layer); returns them."""

  cfg: EncoderConfig
  hop: HopConfig

  @nn.compact
  def __call__(self) -> dict:
    return {name: self.param(name, init, shape) for name, (shape, init) in param_shapes(self.cfg, self.hop).items()}


def _masked_softmax(scores, mask, axis: int):
  """Softmax over `axis` where mask is set; rows with nothing set give zeros (no message), not NaN."""
  scores = jnp.where(mask, scores, -1e30)
  e = jnp.exp(scores - scores.max(axis, keepdims=True)) * mask
  total = e.sum(axis, keepdims=True)
  return e / jnp.where(total > 0, total, 1.0)


def gat(p: dict, cls, links, heads: int):
  """The released code's hop on [CLS] states `cls` [G, N, E] with `links` [G, N(to), N(from)]: new states [G, N, E]
  (one hop layer's `p`, unstacked)."""
  g, n, e = cls.shape
  h = cls.astype(jnp.float32).reshape(g, n, heads, e // heads)
  ft = h @ p["fc"]  # [G, N, H, D]
  a_src, a_dst = (ft * p["attn_l"]).sum(-1), (ft * p["attn_r"]).sum(-1)  # [G, N, H]
  score = jax.nn.leaky_relu(a_src[:, None] + a_dst[:, :, None], LEAKY_SLOPE)  # [G, to, from, H]
  alpha = _masked_softmax(score, links[..., None] > 0, axis=2)
  message = jnp.einsum("gvuh,guhd->gvhd", alpha, ft)
  out = jax.nn.relu((message + h @ p["res_fc"]).reshape(g, n, e))
  return merge(p, out, cls)


def dot(p: dict, cls, links, heads: int):
  """The paper's hop: multi-head dot-product attention of each [CLS] over its in-links' [CLS], merged with it."""
  g, n, e = cls.shape
  x = cls.astype(jnp.float32)
  proj = lambda name: (x @ p[f"{name}_kernel"] + p[f"{name}_bias"]).reshape(g, n, heads, e // heads)
  q, k, v = proj("query"), proj("key"), proj("value")
  score = jnp.einsum("gvhd,guhd->gvuh", q, k) / math.sqrt(e // heads)
  alpha = _masked_softmax(score, links[..., None] > 0, axis=2)
  return merge(p, x, jnp.einsum("gvuh,guhd->gvhd", alpha, v).reshape(g, n, e))


def merge(p: dict, first, second):
  """Linear_2E->E over [first; second]: the code concatenates [hop output; CLS], the paper [CLS; hop output]."""
  both = jnp.concatenate([first.astype(jnp.float32), second.astype(jnp.float32)], -1)
  return both @ p["merge_kernel"] + p["merge_bias"]


def extra_hop(p: dict, cls, links, hop: HopConfig, heads: int):
  """One hop layer on [CLS] states [G, N, E]: the form's new states, nodes without in-links kept (isolated=keep)."""
  new = (gat if hop.form == "gat" else dot)(p, cls, links, heads)
  if hop.isolated == "keep":
    new = jnp.where((links > 0).any(-1, keepdims=True), new, cls.astype(jnp.float32))
  return new.astype(cls.dtype)


class HopLayer(Layer):
  """The BERT layer followed, when its index is a hop layer, by the extra hop on its rows' [CLS] states."""

  hop: HopConfig = HopConfig()

  def __call__(self, carry, layer_index, mask, shared, head_gates, positions, links, hops):
    (x, state), _ = super().__call__(carry, layer_index, mask, shared, head_gates, positions)
    g, n = links.shape[:2]
    j = layer_index - self.hop.from_layer
    heads = heads_of(self.cfg, self.hop)

    def hop(x):
      p = jax.tree.map(lambda a: a[jnp.maximum(j, 0)], hops)
      new = extra_hop(p, x[:, 0].reshape(g, n, -1), links, self.hop, heads)
      return x.at[:, 0].set(new.reshape(g * n, -1))

    return (jax.lax.cond(j >= 0, hop, lambda x: x, x), state), None


class HopEncoder(Encoder):
  """The Encoder (same parameters) with the extra hop after layers from_layer..L-1: x [G * N, S, E] (the rows of
  G graphs of N nodes), links [G, N, N], hops the stacked hop parameters (`Hops`). Returns [G * N, S, E]."""

  hop: HopConfig = HopConfig()

  @nn.compact
  def __call__(self, x, groups, links, hops, head_gates=None):
    c = self.cfg
    check(c, self.hop)
    carry, mask, shared, positions = self.start(x, groups)
    out, _ = scan_layers(remat(HopLayer, c), c, c.num_layers, broadcast=2)(
        c, self.deterministic, hop=self.hop, name="layers")(
        carry, jnp.arange(c.num_layers), mask, shared, head_gates, positions, links, hops)
    return kinds.of(c, "norm").output(out[0])
