"""XLNet's transformer (Yang et al., NeurIPS 2019; transformers' XLNetModel): relative attention with per-layer
r_w/r_r/r_s biases and relative segment encoding, two-stream attention (content stream h, query stream g at the
positions `target_mapping` names, which `perm_mask` restricts; computed for those P positions only), and Transformer-XL memory of each layer's input with the
Compressive Transformer's compressed memory as an option (bertjax.model.memory).

The layers run under the encoder's scan (bertjax.model.encoder.scan_layers: parameters stacked per layer, one
compile for any depth) with the scan's argument slots used as XLNet needs them: the carry is the two streams
(h, g), the broadcast slots carry the masks and the relative positional encoding, and the per-layer slot (BERT's
head gates) carries each layer's memory; each layer returns its next memory (and its reconstruction loss) as the
scan's output. Parameter names follow transformers' (`layer/rel_attn/q`, `layer/ff/layer_1`, ...), stacked on
a leading layer axis; q, k, v, o, r are [d_model, n_head, d_head] as in transformers, without biases.

Numerics are transformers' (modeling_xlnet.py, spec sheet xlnet_memory.md section 1): scores
(ac + bd + ef) * d_head^-0.5 summed before scaling, in float32, masked by subtracting 1e30; post-LN with eps
from the config (1e-12); exact-erf GELU; dropout on the embeddings, the query stream's start, the positional
encoding, the attention probabilities, the output projection, both FFN matmuls and the final output.
"""

import jax
import jax.numpy as jnp
from flax import linen as nn

from bertjax.core import sharding as sh
from bertjax.core.errors import UserError
from bertjax.model import memory as memory_lib, relative
from bertjax.model.dropout import Dropout
from bertjax.model.encoder import remat, scan_layers
from bertjax.model.layers import activation, Block, dense, layer_norm
from bertjax.model.memory import MemoryConfig


def normal(c, names):
  """transformers' XLNet init: normal(initializer_range), with logical axis names."""
  return nn.with_logical_partitioning(nn.initializers.normal(c.init_std), names)


class RelativeAttention(Block):
  """One layer's relative attention parameters and its steps (transformers' XLNetRelativeAttention)."""

  def setup(self):
    c = self.cfg
    shape, names = (c.hidden_size, c.num_heads, c.head_dim), (sh.EMBED, sh.HEADS, sh.KV)
    self.q, self.k, self.v, self.o, self.r = (self.param(n, normal(c, names), shape) for n in "qkvor")
    bias = lambda n: self.param(n, normal(c, (sh.HEADS, sh.KV)), (c.num_heads, c.head_dim))
    self.r_w_bias, self.r_r_bias, self.r_s_bias = bias("r_w_bias"), bias("r_r_bias"), bias("r_s_bias")
    self.seg_embed = self.param("seg_embed", normal(c, (None, sh.HEADS, sh.KV)), (2, c.num_heads, c.head_dim))
    self.layer_norm = layer_norm(c, "layer_norm")
    self.drop = Dropout(c.dropout, generator=c.dropout_rng)
    self.drop_attention = Dropout(c.attention_dropout, generator=c.dropout_rng)

  def project(self, x, w):
    """x [B, T, d] -> heads [B, T, N, D] in the compute dtype."""
    dt = self.cfg.dtype
    return jnp.einsum("btd,dnh->btnh", x.astype(dt), w.astype(dt))

  def core(self, q, k, v, k_r, seg, penalty, at=None, qlen=0):
    """Attention of queries q [B, Q, N, D] over keys/values [B, K, N, D] with the relative encoding's keys k_r
    [B, R, N, D], the segment matrix seg [B, Q, K] (None: no segment term) and the penalty [B, Q, K].
    Returns (the heads' outputs [B, Q, N, D], the probabilities [B, N, Q, K] before dropout). Queries are the
    input's S positions, or with `at` [B, Q] the positions of a qlen-long input they stand at (the query stream's
    targets)."""
    f32 = jnp.float32
    ac = jnp.einsum("bind,bjnd->bnij", q + self.r_w_bias.astype(q.dtype), k, preferred_element_type=f32)
    bd = jnp.einsum("bind,bjnd->bnij", q + self.r_r_bias.astype(q.dtype), k_r, preferred_element_type=f32)
    if at is None:
      score = ac + relative.rel_shift(bd, k.shape[1])
    else:
      score = ac + relative.rel_gather(bd, at, k.shape[1], qlen)
    if seg is not None:  # the score of "same segment" (seg_embed[0]) or "different" (seg_embed[1]) per pair
      ef = jnp.einsum("bind,snd->bnis", q + self.r_s_bias.astype(q.dtype), self.seg_embed.astype(q.dtype),
                      preferred_element_type=f32)
      score = score + jnp.where(seg[:, None], ef[..., 1:2], ef[..., 0:1])
    probs = jax.nn.softmax(score * self.cfg.head_dim ** -0.5 - penalty[:, None], axis=-1)
    kept = self.drop_attention(probs, deterministic=self.deterministic)
    return jnp.einsum("bnij,bjnd->bind", kept.astype(v.dtype), v), probs

  def post(self, x, heads):
    """Output projection, dropout, residual and LayerNorm."""
    out = jnp.einsum("bind,hnd->bih", heads, self.o.astype(heads.dtype))
    return self.layer_norm(x + self.drop(out, deterministic=self.deterministic))


class FeedForward(Block):
  """transformers' XLNetFeedForward: layer_1, activation, dropout, layer_2, dropout, residual, LayerNorm."""

  @nn.compact
  def __call__(self, x):
    c = self.cfg
    drop = lambda y: Dropout(c.dropout, generator=c.dropout_rng)(y, deterministic=self.deterministic)
    y = dense(c, c.hidden_size, c.intermediate_size, (sh.EMBED, sh.MLP), "layer_1")(x)
    y = dense(c, c.intermediate_size, c.hidden_size, (sh.MLP, sh.EMBED), "layer_2")(drop(activation(c, y)))
    return layer_norm(c, "layer_norm")(x + drop(y))


class XLNetLayer(Block):
  """One XLNet layer, called by the layer scan as (carry, layer index, inputs, shared, memory, positional
  encoding): carry (h [B, S, d], g [B, P, d] or None), `inputs` the masks (XLNet.__call__), `memory` this
  layer's {"mem": [B, M, d], "cmem": [B, C, d]} or None, the encoding [1 or B, R, d]. Returns the next carry
  and this layer's next memory ({"mem", "cmem", "cmem_loss"}, or None)."""

  mc: MemoryConfig = MemoryConfig()

  @nn.compact
  def __call__(self, carry, layer_index, inputs, shared, memory, pos_emb):
    del layer_index, shared
    c = self.cfg
    h, g = carry
    attn = RelativeAttention(c, self.deterministic, name="rel_attn")
    ff = FeedForward(c, self.deterministic, name="ff")
    keys = [memory[k].astype(c.dtype) for k in ("cmem", "mem") if memory is not None and k in memory]
    cat = jnp.concatenate(keys + [h], axis=1)
    k, v = attn.project(cat, attn.k), attn.project(cat, attn.v)
    k_r = attn.project(pos_emb, attn.r)
    k_r = jnp.broadcast_to(k_r, (h.shape[0],) + k_r.shape[1:])
    seg = inputs["seg"]
    heads, probs = attn.core(attn.project(h, attn.q), k, v, k_r, seg, inputs["penalty_h"])
    new_h = ff(attn.post(h, heads)).astype(c.dtype)
    new_g = None
    if g is not None:  # the query stream: the same weights and keys, queries at the targets' positions only
      # transformers scatters the P queries to all S positions, attends and gathers back; with one-hot rows of
      # target_mapping (zero rows: padding, whose output is LN(g)) attending at the P positions is the same.
      tm = inputs["target_mapping"]
      at, real = jnp.argmax(tm, axis=-1), jnp.sum(tm, axis=-1).astype(c.dtype)
      rows = lambda x: None if x is None else jnp.take_along_axis(x, at[:, :, None], axis=1)
      heads_g, _ = attn.core(attn.project(g, attn.q), k, v, k_r, rows(seg), rows(inputs["penalty_g"]), at, h.shape[1])
      new_g = ff(attn.post(g, heads_g * real[:, :, None, None])).astype(c.dtype)
    return (new_h, new_g), self.remember(h, memory, probs, attn, inputs["validity"])

  def remember(self, h, memory, probs, attn, validity):
    """This layer's next memory from its input h: the first push_rows rows go into `mem`; the rows they push
    out are compressed into `cmem`, with Algorithm 2's reconstruction loss (bertjax.model.memory)."""
    mc, c = self.mc, self.cfg
    if memory is None:
      return None
    rows = mc.push_rows(h.shape[1])
    new_mem, evicted = memory_lib.fifo(memory["mem"], h[:, :rows].astype(memory["mem"].dtype))
    out = dict(mem=new_mem)
    if mc.cmem_len:
      scores = None
      if mc.cmem_fn == "most_used":  # the attention each memory and input key received, over heads and queries
        got = jax.lax.stop_gradient(probs.mean(axis=(1, 2))[:, mc.cmem_len:])
        scores = memory_lib.fifo(got[:, :mc.mem_len], got[:, mc.mem_len:mc.mem_len + rows])[1]
      compressed = memory_lib.Compress(mc, c.hidden_size, c.init_std, name="compress")(
          jax.lax.stop_gradient(evicted).astype(jnp.float32), scores)
      out["cmem"] = memory_lib.fifo(memory["cmem"], compressed.astype(memory["cmem"].dtype))[0]
      out["cmem_loss"] = memory_lib.reconstruction_loss(h, evicted, validity["evicted"], compressed,
                                                        validity["compressed"], attn.q, attn.k, attn.v)
    return out


class XLNet(Block):
  """transformers' XLNetModel: word embedding, mask_emb, the scanned layers (`layer`), memory.

  __call__(input_ids [B, S] int, type_ids [B, S] or None, attention_mask [B, S] or None (1 real, 0 padding),
  perm_mask [B, S, S] or None (1: query i may not see key j), target_mapping [B, P, S] or None (row m one-hot
  at the position of prediction m; zero rows for padding), memory: the state bertjax.model.memory describes,
  or None for an empty one) returns a dict:
  - `hidden`: [B, P, d] (the query stream, when target_mapping is given) or [B, S, d] (the content stream);
  - `content`: [B, S, d], the content stream's last layer (before the output dropout);
  - `memory`: the next memory state (None when mem_len is 0);
  - `cmem_loss`: the attention-reconstruction loss summed over layers (0.0 without compressed memory).
  type_ids None drops the segment term (transformers' token_type_ids=None); zeros do not.
  """

  mc: MemoryConfig = MemoryConfig()

  def setup(self):
    c = self.cfg
    if c.hidden_size != c.num_heads * c.head_dim:
      raise UserError(f"XLNet needs model.hidden_size={c.hidden_size} = num_heads x head width")
    self.word_embedding = self.param("word_embedding", normal(c, (sh.VOCAB, sh.EMBED)), (c.vocab_size, c.hidden_size))
    self.mask_emb = self.param("mask_emb", normal(c, (sh.EMBED,)), (c.hidden_size,))
    self.layer = scan_layers(remat(XLNetLayer, c), c, c.num_layers)(c, self.deterministic, self.mc)
    self.drop = Dropout(c.dropout, generator=c.dropout_rng)

  def __call__(self, input_ids, type_ids=None, attention_mask=None, perm_mask=None, target_mapping=None,
               memory=None):
    c, mc = self.cfg, self.mc
    b, s = input_ids.shape
    drop = lambda x: self.drop(x, deterministic=self.deterministic)
    if memory is None:
      memory = memory_lib.empty(c.num_layers, b, c.hidden_size, mc, c.dtype)
    rows = mc.push_rows(s)
    if rows > s:
      raise UserError(f"model.xlnet.reuse_len={mc.reuse_len} is longer than the segment ({s} tokens): use at most {s}")
    if memory is not None and mc.cmem_len and rows % mc.cmem_rate:
      raise UserError(f"model.xlnet.cmem_rate={mc.cmem_rate} must divide the {rows} rows each segment pushes")
    key_valid = memory_lib.key_valid(memory, b, mc)
    slots = key_valid.shape[1]
    penalty_h, penalty_g = relative.stream_penalties(s, key_valid, attention_mask, perm_mask, mc.attn_type)
    pos_emb = relative.positional_encoding(s, slots + s, c.hidden_size, b, mc.attn_type, mc.clamp_len, mc.bi_data)
    h = drop(jnp.take(self.word_embedding, input_ids, axis=0).astype(c.dtype))
    g = None
    if target_mapping is not None:
      g = drop(jnp.broadcast_to(self.mask_emb.astype(c.dtype), (b, target_mapping.shape[1], c.hidden_size)))
    inputs = dict(seg=None if type_ids is None else relative.segment_matrix(type_ids, slots),
                  penalty_h=penalty_h, penalty_g=penalty_g, target_mapping=target_mapping,
                  validity={} if memory is None else memory_lib.next_validity(memory, rows, mc))
    per_layer = None if memory is None else {k: memory[k] for k in ("mem", "cmem") if k in memory}
    (h, g), ys = self.layer((h, g), jnp.arange(c.num_layers), inputs, {}, per_layer, drop(pos_emb.astype(c.dtype)))
    new_memory, loss = None, jnp.float32(0.0)
    if memory is not None:
      new_memory = {k: ys[k] for k in ("mem", "cmem") if k in ys}
      new_memory.update({k: v for k, v in inputs["validity"].items() if k in ("mem_valid", "cmem_valid")})
      if "cmem_loss" in ys:
        loss = ys["cmem_loss"].sum()
    return dict(hidden=drop(g if g is not None else h), content=h, memory=new_memory, cmem_loss=loss)

  def lm_logits(self, hidden):
    """hidden [..., d] @ word_embedding^T in float32 (the tied LM weight)."""
    return jnp.einsum("...d,vd->...v", hidden, self.word_embedding.astype(hidden.dtype),
                      preferred_element_type=jnp.float32)
