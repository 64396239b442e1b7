"""Reversible residual layers (Gomez et al. 2017, "The Reversible Residual Network"; Kitaev et al., ICLR 2020,
"Reformer"): a stack of layers over two streams, Y1 = X1 + F(X2), Y2 = X2 + G(Y1), whose backward pass recomputes
each layer's inputs from its outputs (X2 = Y2 - G(Y1), X1 = Y1 - F(X2)) instead of storing them, as transformers'
_ReversibleFunction and ReformerLayer.backward_pass do. One `jax.custom_vjp` spans the whole stack: its forward
pass keeps only the last layer's two streams, so the activations kept for the backward pass do not grow with depth.

F and G are flax blocks called as `block(x, mask, positions, layer_index)`; the recomputation calls them with the
same dropout keys (one per layer and block, folded from the stack's key) and the same attention-kind inputs, so
it repeats the forward pass exactly: LSH attention draws its rotations from the same key, and gets the buckets its
forward pass hashed (kept, small integers, and passed in through bertjax.model.lsh's `lsh_buckets` collection, as
transformers' backward pass reuses its cached buckets), so a reconstruction's rounding cannot flip one. The streams are float32 whatever the compute dtype: the reconstruction
subtracts, and bf16 streams lose the gradient (the spec sheet's pitfall 6).

`model.reversible=False` runs the same layers, the same parameters and the same keys under plain autodiff (with
the remat policy, per layer): the reference the custom VJP's gradients are tested against, and the remat stack the
benchmark compares it with.
"""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

from bertjax.core import sharding as sh
from bertjax.model import kinds, lsh
from bertjax.model.dropout import token_dropout
from bertjax.model.hparams import REMAT_POLICIES
from bertjax.model.layers import Block, layer_norm


def forward(fns, params, x1, x2, aux):
  """The two streams through every layer: fns[i] = (F, G) pure functions (params, x, aux) -> [B, S, H]."""
  for (f, g), p, a in zip(fns, params, aux):
    x1 = x1 + f(p, x2, a)
    x2 = x2 + g(p, x1, a)
  return x1, x2


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def reversible(fns, params, x1, x2, aux):
  """`forward`, differentiated by recomputing each layer's inputs from its outputs (the module docstring)."""
  return forward(fns, params, x1, x2, aux)


def _reversible_fwd(fns, params, x1, x2, aux):
  buckets = []
  for (f, g), p, a in zip(fns, params, aux):  # `forward`, keeping each layer's LSH buckets (small integers)
    y, bk = f(p, x2, a, capture=True)
    x1 = x1 + y
    x2 = x2 + g(p, x1, a)
    buckets.append(bk)
  return (x1, x2), (params, x1, x2, aux, tuple(buckets))  # no per-layer activations: the last outputs, buckets


def _reversible_bwd(fns, residuals, cotangents):
  params, y1, y2, aux, buckets = residuals
  dy1, dy2 = cotangents
  grads = [None] * len(fns)
  for i in reversed(range(len(fns))):
    (f, g), p, a = fns[i], params[i], aux[i]
    gy, g_vjp = jax.vjp(lambda p_, y: g(p_, y, a), p, y1)
    x2 = y2 - gy  # this layer's input X2
    dp_g, dy1_g = g_vjp(dy2)
    dy1 = dy1 + dy1_g  # Y1 reaches the output directly and through G
    fx, f_vjp = jax.vjp(lambda p_, x: f(p_, x, a, buckets=buckets[i]), p, x2)  # the forward pass's buckets
    x1 = y1 - fx  # this layer's input X1
    dp_f, dx2_f = f_vjp(dy1)
    grads[i] = jax.tree.map(jnp.add, dp_f, dp_g)
    dy2 = dy2 + dx2_f  # dX2 = dY2 + dF/dX2; dX1 = dY1
    y1, y2 = x1, x2
  return tuple(grads), dy1, dy2, jax.tree.map(_zero_cotangent, aux)


reversible.defvjp(_reversible_fwd, _reversible_bwd)


def _zero_cotangent(x):
  """The zero cotangent of an input the stack does not differentiate (masks, tables, integer keys)."""
  if jnp.issubdtype(x.dtype, jnp.inexact):
    return jnp.zeros_like(x)
  return np.zeros(x.shape, jax.dtypes.float0)


def pure(block, c, deterministic: bool, index, typed_key: bool):
  """Block class `block` as a pure function (params, x, (mask, positions, key, layer index)) -> float32, of layer
  `index` (a Python int: attention kinds may pick a layer's kind statically), or None: the index its aux holds."""

  def fn(params, x, aux, buckets=None, capture=False):
    """`buckets`: what an LSH block hashed in the forward pass, passed in instead of hashed again (transformers'
    reversible backward pass reuses its cached buckets); `capture`: returns (output, those buckets) too."""
    mask, positions, key, traced_index = aux
    rngs = {}
    if not deterministic:
      rngs = {"dropout": jax.random.wrap_key_data(key) if typed_key else key}
    variables = {"params": params, **({lsh.BUCKETS: buckets} if buckets else {})}
    module = block(c, deterministic, parent=None)
    args = (x.astype(c.dtype), mask, positions, traced_index if index is None else index)
    if not capture:
      return module.apply(variables, *args, rngs=rngs).astype(jnp.float32)
    y, state = module.apply(variables, *args, rngs=rngs, mutable=["intermediates"])
    return y.astype(jnp.float32), _sown_buckets(state.get("intermediates", {}))

  return fn


def layer_keys(module, n: int):
  """Per layer, the raw key data of its F and G blocks' dropout ([n, 2, ...] uint32; zeros when deterministic), and
  whether the run's keys are typed (jax.random.key) rather than raw uint32 pairs."""
  if module.deterministic:
    return np.zeros((n, 2, 2), np.uint32), False
  key = module.make_rng("dropout")
  typed = jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key)
  keys = jax.vmap(lambda i: jax.random.split(jax.random.fold_in(key, i)))(jnp.arange(n))
  return (jax.random.key_data(keys) if typed else keys), typed


def stack_of(layer_module, f_block, g_block):
  """The flax stack module (LayerKind.stack's contract) of `layer_module` (a flax module whose `attention` and
  `ffn` children are the blocks `f_block` and `g_block`, used to create the parameters at init)."""

  class ReversibleStack(Block):
    """Every layer over the two streams (the norm kind's carry), then a LayerNorm over their concatenation
    [B, S, 2H] and dropout, as transformers' ReformerEncoder ends. Parameters: `layer_{i}/{attention,ffn}`, `ln`."""

    @nn.compact
    def __call__(self, carry, layer_index, mask, shared, head_gates=None, positions=None):
      c, n = self.cfg, self.cfg.num_layers
      (x1, x2), state = carry
      assert state is None, "an attention kind with a state up the stack does not run in a reversible stack"
      x1, x2 = x1.astype(jnp.float32), x2.astype(jnp.float32)  # float32 streams (module docstring)
      if self.is_initializing():  # the parameters, through the layer module's own scopes
        for i in range(n):
          ((x1, x2), _), _ = layer_module(c, self.deterministic, name=f"layer_{i}")(
              ((x1, x2), None), i, mask, shared, None, positions)
      else:
        keys, typed = layer_keys(self, n)
        fns = tuple((pure(f_block, c, self.deterministic, i, typed), pure(g_block, c, self.deterministic, i, typed))
                    for i in range(n))
        params = tuple(sh.strip_boxes(self.variables["params"][f"layer_{i}"]) for i in range(n))
        params = tuple({"attention": p["attention"], "ffn": p["ffn"]} for p in params)
        aux = tuple(((mask, positions, keys[i, 0], jnp.int32(i)), (mask, positions, keys[i, 1], jnp.int32(i)))
                    for i in range(n))
        fns = tuple((_split(f, 0, "attention"), _split(g, 1, "ffn")) for f, g in fns)
        if c.reversible:
          x1, x2 = reversible(fns, params, x1, x2, aux)
        else:
          attention = kinds.of(c, "attention")  # a scan needs one kind (one config) in every layer
          alike = (len({str(jax.tree.map(jnp.shape, p)) for p in params}) == 1
                   and all(attention.layer_kind(c, i, mask)[0] == c for i in range(n)))
          scanned = (_split(pure(f_block, c, self.deterministic, None, typed), 0, "attention"),
                     _split(pure(g_block, c, self.deterministic, None, typed), 1, "ffn"))
          x1, x2 = plain(fns, params, x1, x2, aux, c.remat, scanned if alike else None)
      norm = layer_norm(dataclasses.replace(c, use_bias=True), "ln")  # with a bias, as ReformerEncoder.layer_norm
      out = norm(jnp.concatenate([x1, x2], axis=-1))
      out = token_dropout(c, c.dropout)(out, deterministic=self.deterministic).astype(c.dtype)
      return (nn.with_logical_constraint(out, (sh.BATCH, sh.LENGTH, sh.ACT_EMBED)), state), None

  return ReversibleStack


def _split(fn, which: int, name: str):
  """A block function of one layer reading its own part of the layer's parameters and of its aux pair."""
  return lambda p, x, a, **kw: fn(p[name], x, a[which], **kw)


def _sown_buckets(sown: dict) -> dict:
  """The `buckets` an LSH block sowed, as the lsh_buckets collection takes them ({} when the block is no LSH)."""
  out = {}
  for name, value in sown.items():
    if isinstance(value, dict):
      inner = _sown_buckets(value)
      if inner:
        out[name] = inner
    elif name == "buckets":
      out[name] = value[0]
  return out


def plain(fns, params, x1, x2, aux, remat: str, scanned_fns=None):
  """The same stack under plain autodiff, each layer under the remat policy (`none`: every activation kept). With
  `scanned_fns` (F, G reading the layer index from their aux: every layer's parameters alike) the layers run under
  lax.scan, as bertjax's scanned stack does: XLA then recomputes one layer at a time, where over unrolled layers it
  hoists every layer's recomputation to the start of the backward pass, all alive at once (measured on the CPU:
  remat=full then needs as much temporary memory as none)."""
  if scanned_fns is None:
    for (f, g), p, a in zip(fns, params, aux):
      x1, x2 = _remat(lambda p_, x1_, x2_, a_, f=f, g=g: forward(((f, g),), (p_,), x1_, x2_, (a_,)), remat)(
          p, x1, x2, a)
    return x1, x2
  layer = _remat(lambda p_, x1_, x2_, a_: forward((scanned_fns,), (p_,), x1_, x2_, (a_,)), remat)
  stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *params)
  (mask, positions, _, _), _ = aux[0]  # every layer's; only the keys and the index are scanned over
  per_layer = jax.tree.map(lambda *leaves: jnp.stack(leaves), *[tuple(b[2:] for b in a) for a in aux])

  def step(xs, slices):
    p, blocks = slices
    return layer(p, *xs, tuple((mask, positions, *b) for b in blocks)), None

  (x1, x2), _ = jax.lax.scan(step, (x1, x2), (stacked, per_layer))
  return x1, x2


def _remat(layer, remat: str):
  return layer if remat == "none" else jax.checkpoint(layer, policy=REMAT_POLICIES[remat], prevent_cse=False)
