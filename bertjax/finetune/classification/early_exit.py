"""The early-exit classifier: a classifier after every encoder layer (DeeBERT's highways, PABEE's per-layer
linears over a shared pooler, FastBERT's students, the depth classifier's halting), and the inference path that
really stops: a `lax.while_loop` over the layers that ends once every example of the batch has exited.

`EarlyExitClassifier` returns every layer's logits [B, L, C] (training, and the evaluation that computes every
layer and applies the rule afterwards: exit_rules.exit_layers); for `depth` a last channel holds q(n | x)'s
logits over the L depths, [B, L, C + 1]. Its parameter names match the Classifier's (embeddings, encoder), so the
backbone comes from any checkpoint; the heads live under `exits`, stacked over layers on their leading axis (the
last entry is the final layer's head: DeeBERT's and FastBERT's main classifier / teacher). A pooled head reads [CLS]
(`pooling="cls"`, the references') or the mean of the layer's real tokens (`"mean"`: for a checkpoint trained with
mean pooling, such as the sentence-transformers models, whose [CLS] carries almost nothing below the last layer).
"""

import jax
import jax.numpy as jnp
from flax import linen as nn

from bertjax.core import sharding as sh
from bertjax.core.errors import UserError
from bertjax.finetune.classification import exit_rules
from bertjax.model import kinds
from bertjax.model.embeddings import Embeddings
from bertjax.model.encoder import Encoder, remat, scan_layers
from bertjax.model.hparams import EncoderConfig
from bertjax.model.layer import Layer

METHODS = tuple(exit_rules.RULES)
STUDENT = 128  # FastBERT's classifier width (cla_hidden_size) and its 2 attention heads
STUDENT_HEADS = 2
TOKEN_HEADS = ("fastbert", "depth")  # heads that read every token of a layer, not only [CLS]


class HiddenLayer(Layer):
  """A Layer that also returns its output (the norm kind's encoder output) as the scan's per-layer value: every
  token's (`keep_tokens`) or the [CLS] position's."""

  keep_tokens: bool = False

  def __call__(self, carry, layer_index, mask, shared, head_gates=None, positions=None):
    carry, _ = super().__call__(carry, layer_index, mask, shared, head_gates, positions)
    h = kinds.of(self.cfg, "norm").output(carry[0])  # the carry: (the norm kind's, the attention kind's state)
    return carry, (h if self.keep_tokens else h[:, 0])


class ExitEncoder(Encoder):
  """The Encoder (same parameters) returning every layer's output [L, B, (S,) H]; with `start_only`, what the
  layers start from instead: (carry, attention mask input, shared blocks, position tables)."""

  keep_tokens: bool = False

  @nn.compact
  def __call__(self, x, groups, start_only: bool = False):
    c = self.cfg
    if kinds.of(c, "layer").module is not Layer:  # HiddenLayer extends the BERT layer
      raise UserError(f"early exit runs on the bert layer kind; this model's is model.layer={c.layer}")
    carry, mask, shared, positions = self.start(x, groups)
    if start_only:
      return carry, mask, shared, positions
    layer = remat(HiddenLayer, c)
    _, hidden = scan_layers(layer, c, c.num_layers)(c, self.deterministic, keep_tokens=self.keep_tokens,
                                                    name="layers")(carry, jnp.arange(c.num_layers), mask, shared,
                                                                   None, positions)
    return hidden


def pooled(h, groups, pooling: str):
  """What a pooled head reads of a layer's output h ([B, S, H], or [B, H] when only [CLS] was kept): h[CLS], or
  (`mean`) the mean over the real tokens (groups > 0)."""
  if pooling == "cls":
    return h[:, 0] if h.ndim == 3 else h
  w = (groups > 0).astype(h.dtype)[..., None]
  return (h * w).sum(1) / jnp.maximum(w.sum(1), 1.0)


def head_features(method: str, p: dict, h, groups, pooling: str = "cls"):
  """One layer's exit head up to its classifier: tanh(pooler(pooled h)) (DeeBERT: the layer's own pooler; PABEE and
  depth: one shared pooler; `pooled` reads [CLS] or the token mean), or FastBERT's student: tanh(H -> 128) over
  every token, 2-head attention for the [CLS] query over the real tokens, tanh(128 -> 128). `p`: the layer's slice
  of the `exits` params."""
  if method != "fastbert":
    return jnp.tanh(pooled(h, groups, pooling) @ p["pooler_kernel"] + p["pooler_bias"])
  x = jnp.tanh(h @ p["narrow_kernel"] + p["narrow_bias"])  # [B, S, 128]
  split = lambda t: t.reshape(t.shape[:-1] + (STUDENT_HEADS, STUDENT // STUDENT_HEADS))
  q = split(x[:, 0] @ p["query"])  # [B, heads, d]
  k, v = split(x @ p["key"]), split(x @ p["value"])  # [B, S, heads, d]
  scores = jnp.einsum("bnd,bsnd->bns", q, k) / jnp.sqrt(STUDENT // STUDENT_HEADS)
  scores = jnp.where((groups > 0)[:, None, :], scores, -1e9)
  att = jnp.einsum("bns,bsnd->bnd", jax.nn.softmax(scores, -1), v).reshape(x.shape[0], STUDENT)
  return jnp.tanh((att @ p["attention_out"]) @ p["dense_kernel"] + p["dense_bias"])


def head_logits(p: dict, features):
  """The exit head's classifier: its features -> logits [B, C]."""
  return features @ p["classifier_kernel"] + p["classifier_bias"]


def layer_slice(params: dict, j) -> dict:
  """Layer j's head params: the stacked entries at j, shared ones (PABEE's pooler) as they are."""
  return {k: (v[j] if k in STACKED_BY_LAYER_NDIM and v.ndim == STACKED_BY_LAYER_NDIM[k] else v)
          for k, v in params.items()}


# name -> the rank a parameter has when it is stacked over layers (PABEE's shared pooler has one less)
STACKED_BY_LAYER_NDIM = {"pooler_kernel": 3, "pooler_bias": 2, "classifier_kernel": 3, "classifier_bias": 2,
                         "narrow_kernel": 3, "narrow_bias": 2, "query": 3, "key": 3, "value": 3,
                         "attention_out": 3, "dense_kernel": 3, "dense_bias": 2}


def head_shapes(method: str, c: EncoderConfig, layers: int, outputs: int) -> dict:
  """name -> shape of the `exits` params of `method`."""
  h, w = c.hidden_size, STUDENT
  shapes = dict(classifier_kernel=(layers, w if method == "fastbert" else h, outputs),
                classifier_bias=(layers, outputs))
  if method == "fastbert":
    shapes.update(narrow_kernel=(layers, h, w), narrow_bias=(layers, w), query=(layers, w, w), key=(layers, w, w),
                  value=(layers, w, w), attention_out=(layers, w, w), dense_kernel=(layers, w, w),
                  dense_bias=(layers, w))
  elif method == "deebert":
    shapes.update(pooler_kernel=(layers, h, h), pooler_bias=(layers, h))
  else:  # pabee, depth: one pooler shared by the layers (PABEE's)
    shapes.update(pooler_kernel=(h, h), pooler_bias=(h,))
  if method == "depth":
    shapes.update(depth_kernel=(h, layers), depth_bias=(layers,))
  return shapes


def depth_logits(p: dict, h_first, groups):
  """q(n | x)'s logits [B, L]: a linear map of the mean of the first layer's real tokens (Elbayad et al.'s
  sequence-level halting, q(n|x) = softmax(W mean(h) + b), read after layer 1 so the depth is known early)."""
  w = (groups > 0).astype(jnp.float32)[..., None]
  mean = (h_first.astype(jnp.float32) * w).sum(1) / jnp.maximum(w.sum(1), 1.0)
  return mean @ p["depth_kernel"] + p["depth_bias"]


class EarlyExitClassifier(nn.Module):
  """Embeddings, the encoder, and an exit head after every layer (`method`: deebert | pabee | fastbert | depth)."""

  cfg: EncoderConfig
  num_outputs: int
  method: str = "pabee"
  classifier_dropout: float = 0.1
  deterministic: bool = True
  pooling: str = "cls"  # what the pooled heads (every method's but FastBERT's students) read: cls | mean

  @property
  def keeps_tokens(self) -> bool:
    """Whether the heads read every token of a layer (FastBERT's students, the depth classifier, mean pooling)."""
    return self.method in TOKEN_HEADS or self.pooling == "mean"

  @nn.compact
  def __call__(self, input_ids, type_ids, groups):
    """Every layer's logits [B, L, C] (depth: [B, L, C + 1], q(n|x)'s logits in the last channel)."""
    c = self.cfg
    x = Embeddings(c, name="embeddings")(input_ids, type_ids, self.deterministic)
    hidden = ExitEncoder(c, self.deterministic, keep_tokens=self.keeps_tokens, name="encoder")(x, groups)
    p = self.exit_params()
    f = jax.vmap(lambda pj, hj: head_features(self.method, pj, hj, groups, self.pooling),
                 in_axes=(in_axes_of(p), 0))(p, hidden.astype(jnp.float32))
    f = nn.Dropout(self.classifier_dropout)(f, deterministic=self.deterministic)
    logits = jax.vmap(head_logits, in_axes=(in_axes_of(p), 0))(p, f).transpose(1, 0, 2)  # [B, L, C]
    if self.method == "depth":
      logits = jnp.concatenate([logits, depth_logits(p, hidden[0], groups)[..., None]], -1)
    return logits.astype(jnp.float32)

  def exit_params(self) -> dict:
    """The `exits` params (truncated normal init_std kernels, zero biases), stacked over layers."""
    c = self.cfg
    shapes = tuple(head_shapes(self.method, c, c.num_layers, self.num_outputs).items())
    return _ExitParams(shapes, c.init_std, name="exits")()


class _ExitParams(nn.Module):
  """The `exits` parameter dict (a module so that they sit under one name)."""

  shapes: tuple
  std: float

  @nn.compact
  def __call__(self) -> dict:
    def init(shape, bias):
      if bias:
        return lambda rng: jnp.zeros(shape, jnp.float32)
      return lambda rng: self.std * jax.random.truncated_normal(rng, -2.0, 2.0, shape, jnp.float32)
    return {name: self.param(name, init(shape, name.endswith("bias"))) for name, shape in self.shapes}


def in_axes_of(p: dict) -> dict:
  """vmap axes of the `exits` params over layers: 0 for the stacked ones, None for shared (pooler, depth)."""
  return {k: (0 if k in STACKED_BY_LAYER_NDIM and v.ndim == STACKED_BY_LAYER_NDIM[k] else None) for k, v in p.items()}


def exit_loop(model: EarlyExitClassifier, params: dict, input_ids, type_ids, groups, threshold: float,
              delta: float = 0.1):
  """(logits at each example's exit [B, C], exit layer [B] counting from 1, layers computed for the batch): the
  layers run one at a time under `lax.while_loop` over the stacked parameters (as Encoder.split_stack applies a
  layer to its slice), each followed by its exit head and the method's rule; the loop ends when every example
  has exited, so a batch stops computing at its deepest exit. Same answers as computing every layer and
  exit_rules.exit_layers (per example; a deterministic model)."""
  c, n, method = model.cfg, model.cfg.num_layers, model.method
  rule = exit_rules.RULES[method]
  x = Embeddings(c, parent=None).apply({"params": params["embeddings"]}, input_ids, type_ids, True)
  encoder = ExitEncoder(c, True, parent=None)
  carry, mask, shared, positions = encoder.apply({"params": params["encoder"]}, x, groups, True)
  stacked = sh.strip_boxes(params["encoder"].get("layers", {}))
  exits = params["exits"]
  layer = Layer(c, True, parent=None)
  b = input_ids.shape[0]
  out_dim = exits["classifier_bias"].shape[-1]

  def body(state):
    j, carry, rule_carry, done, layer_at, chosen, depth = state
    slice_j = jax.tree.map(lambda p: jax.lax.dynamic_index_in_dim(p, j, keepdims=False), stacked)
    carry, _ = layer.apply({"params": slice_j}, carry, j, mask, shared, None, positions)
    h = kinds.of(c, "norm").output(carry[0]).astype(jnp.float32)
    pj = layer_slice(exits, j)
    logits = head_logits(pj, head_features(method, pj, h, groups, model.pooling))
    if method == "depth":
      depth = jnp.where(j == 0, depth_logits(exits, h, groups), depth)
    rule_carry, ok = exit_rules.qualifies(rule, threshold, rule_carry, logits, j, depth, delta)
    new = (ok | (j == n - 1)) & ~done
    layer_at = jnp.where(new, j + 1, layer_at)
    chosen = jnp.where(new[:, None], logits, chosen)
    return j + 1, carry, rule_carry, done | new, layer_at, chosen, depth

  state = (jnp.int32(0), carry, exit_rules.start(b), jnp.zeros((b,), bool), jnp.full((b,), n, jnp.int32),
           jnp.zeros((b, out_dim), jnp.float32), jnp.zeros((b, n), jnp.float32))
  j, _, _, _, layer_at, chosen, _ = jax.lax.while_loop(lambda s: (s[0] < n) & ~jnp.all(s[3]), body, state)
  return chosen, layer_at, j
