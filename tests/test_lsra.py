"""Long-short range attention (bertjax.model.lsra, the Lite Transformer's): the convolution against a NumPy
transcription of the authors' LightweightConv1dTBC / DynamicConv1dTBC (`_forward_unfolded`, and the band matrices of
`_forward_expanded`), the spec sheet's hand-computed value, packed examples computed as if alone, the reference's
parameter count per layer, FLOPs, config checks, and a few training steps."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from bertjax.core import sharding
from bertjax.core.errors import UserError
from bertjax.data.tokenizer import SPM_SPECIAL
from bertjax.model import config as model_config, kinds, lsra
from bertjax.model.hparams import EncoderConfig
from bertjax.train import build
from conftest import load_config, micro


# A NumPy transcription of the reference's two paths (mit-han-lab/lite-transformer, fairseq/modules/
# lightweight_convolution.py and dynamic_convolution.py), in its T x B x C layout. `weight` [T, B, H, K]: the
# softmax-normalized kernel of every position (a light convolution's is the same at every position).
def reference_unfolded(x, weight, pad):
  """_forward_unfolded: unfold1d pads `pad` zeros on the left and K - 1 - pad on the right, window k of step t is
  x[t + k - pad]; each head's R = C / H contiguous channels are multiplied by that head's K taps (a bmm)."""
  t, b, c = x.shape
  h, k = weight.shape[2:]
  padded = np.concatenate([np.zeros((pad, b, c)), x, np.zeros((k - 1 - pad, b, c))])
  unfolded = np.stack([padded[i:i + t] for i in range(k)], axis=-1).reshape(t * b * h, c // h, k)
  return (unfolded @ weight.reshape(t * b * h, k, 1)).reshape(t, b, c)


def reference_expanded(x, weight, pad):
  """_forward_expanded: each (batch, head)'s kernels written into a [T, T + K - 1] band (row t's taps from column
  t), its columns pad .. pad + T - 1 kept, times the head's channels."""
  t, b, c = x.shape
  h, k = weight.shape[2:]
  w = weight.reshape(t, b * h, k).transpose(1, 0, 2)
  band = np.zeros((b * h, t, t + k - 1))
  for row in range(t):
    band[:, row, row:row + k] = w[:, row]
  band = band[:, :, pad:pad + t]
  xs = x.reshape(t, b * h, c // h).transpose(1, 0, 2)
  return (band @ xs).transpose(1, 0, 2).reshape(t, b, c)


def _softmax(a):
  e = np.exp(a - a.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def _bertjax(conv, x, weight, pad, groups=None):
  """A bertjax convolution on the reference's T x B x C input and [T, B, H, K] kernels."""
  u, w = jnp.asarray(x.transpose(1, 0, 2), jnp.float32), jnp.asarray(weight.transpose(1, 0, 2, 3), jnp.float32)
  groups = jnp.ones(u.shape[:2], jnp.int32) if groups is None else groups
  return np.asarray(jax.jit(conv, static_argnums=3)(u, w, groups, pad)).transpose(1, 0, 2)


def test_the_convolution_is_the_references_forward_unfolded_and_its_band_matrices():
  # The spec sheet's value (specs/iclr2020_variants.md §1(f)): T=2, C=2, H=1, K=3, P=1, W=[[0, 1, 2]], x=[[1, 2], [3, 4]].
  x = np.array([[1.0, 2.0], [3.0, 4.0]])[:, None]  # [T, B=1, C]
  weight = np.broadcast_to(_softmax(np.array([[0.0, 1.0, 2.0]])), (2, 1, 1, 3))
  expected = np.array([[2.24045134, 3.15042077], [0.82421599, 1.15897503]])
  np.testing.assert_allclose(reference_unfolded(x, weight, 1)[:, 0], expected, rtol=1e-7)
  np.testing.assert_allclose(reference_expanded(x, weight, 1)[:, 0], expected, rtol=1e-7)
  for conv in (lsra.conv_unfolded, lsra.conv_band):
    np.testing.assert_allclose(_bertjax(conv, x, weight, 1)[:, 0], expected, rtol=1e-6)
  # Dynamic kernels (one per position, batch and head), 3 heads of 2 channels, an even kernel (the reference pads
  # (K - 1) // 2 on the left) and one longer than the row (K > T).
  rng = np.random.default_rng(0)
  for t, k in ((9, 4), (9, 5), (3, 7)):
    x = rng.normal(size=(t, 2, 6))
    weight = _softmax(rng.normal(size=(t, 2, 3, k)))
    pad = (k - 1) // 2
    want = reference_unfolded(x, weight, pad)
    np.testing.assert_allclose(reference_expanded(x, weight, pad), want, rtol=1e-10)
    for conv in (lsra.conv_unfolded, lsra.conv_band):
      np.testing.assert_allclose(_bertjax(conv, x, weight, pad), want, rtol=1e-5, atol=1e-6)


def test_convolution_taps_stay_inside_their_example_and_skip_padding():
  rng = np.random.default_rng(1)
  x, weight = rng.normal(size=(10, 1, 4)), _softmax(rng.normal(size=(10, 1, 2, 5)))
  groups = jnp.asarray([[1] * 4 + [2] * 3 + [0] * 3])
  for conv in (lsra.conv_unfolded, lsra.conv_band):
    packed = _bertjax(conv, x, weight, 2, groups)
    np.testing.assert_allclose(packed[:4], reference_unfolded(x[:4], weight[:4], 2), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(packed[4:7], reference_unfolded(x[4:7], weight[4:7], 2), rtol=1e-5, atol=1e-6)
  # Without the groups the first example's last position reads the second's: the test above would see it.
  assert not np.allclose(_bertjax(lsra.conv_band, x, weight, 2)[3], packed[3], atol=1e-3)


def _config(**kw):
  base = dict(vocab_size=10, hidden_size=16, num_layers=3, num_heads=2, intermediate_size=16, embedding_size=16,
              attention_kind="lsra", lsra_kernel_sizes=(3, 5, 7), dropout=0.0, attention_dropout=0.0)
  return EncoderConfig(**{**base, **kw})


@pytest.mark.parametrize("conv,glu", [("dynamic", True), ("lightweight", False)])
def test_packed_examples_equal_running_them_apart(conv, glu):
  """The whole LSRA block (attention half, convolution half, residual and norm), at each layer's kernel size (the
  layer index traced, as in the layer scan)."""
  c = _config(lsra_conv=conv, lsra_glu=glu)
  kind, block = kinds.of(c, "attention"), lsra.LongShortRangeAttention(c)
  x = jax.random.normal(jax.random.key(0), (1, 12, 16))
  groups = jnp.asarray([[1] * 5 + [2] * 4 + [0] * 3])
  params = nn.unbox(block.init(jax.random.key(1), x, kind.mask(c, groups)))
  run = jax.jit(lambda x, g, layer: block.apply(params, x, kind.mask(c, g), layer_index=layer))
  alone = lambda part, layer: run(x[:, part], jnp.ones((1, part.stop - part.start), jnp.int32), layer)
  for layer in range(3):
    packed = run(x, groups, layer)
    np.testing.assert_allclose(packed[:, :5], alone(slice(0, 5), layer), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(packed[:, 5:9], alone(slice(5, 9), layer), rtol=1e-5, atol=1e-5)
  # The kernel sizes differ per layer: layer 0 (3 taps) and layer 2 (7 taps) differ on the same input.
  assert not np.allclose(run(x, groups, 0), run(x, groups, 2), atol=1e-4)
  # Every parameter of both branches gets a gradient (through the band matrices and the tap mask).
  loss = lambda p: (block.apply(p, x, kind.mask(c, groups), layer_index=1)[:, :9] ** 2).sum()
  grads = jax.jit(jax.grad(loss))(params)["params"]
  for name in ("query", "output", "conv_in", "conv_out", "conv_weights" if conv == "dynamic" else "conv_kernel"):
    g = np.asarray(grads[name] if name == "conv_kernel" else grads[name]["kernel"])
    assert np.isfinite(g).all() and np.abs(g).max() > 0, name


def test_layer_taps_are_centred_in_the_largest_kernel():
  c = _config(lsra_kernel_sizes=(3, 4, 7))
  taps = [np.asarray(lsra.active_taps(c, i)).astype(int).tolist() for i in range(3)]
  # P = (K - 1) // 2 left of the centre: offsets -1..1, -1..2 and -3..3 within the 7 taps' -3..3.
  assert taps == [[0, 0, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 0], [1] * 7]
  assert lsra.kernel_sizes(_config(lsra_kernel_sizes=(), num_layers=6)) == (3, 7, 15, 31, 31, 31)  # the reference's
  assert lsra.kernel_sizes(_config(lsra_kernel_sizes=(5,))) == (5, 5, 5)


def _block_params(spec):
  c = model_config.encoder_config(load_config(spec).model)
  x = jax.ShapeDtypeStruct((1, 4, c.hidden_size), jnp.float32)
  mask = (jnp.zeros((1, 1, 4, 4)), jnp.ones((1, 4), jnp.int32))
  shapes = jax.eval_shape(lambda x: lsra.LongShortRangeAttention(c).init(jax.random.key(0), x, mask), x)
  return sum(int(np.prod(leaf.shape)) for leaf in jax.tree.leaves(shapes))


def test_block_parameters_are_the_references_per_layer_at_its_largest_kernel():
  """The reference's TransformerEncoderLayer.self_attn (MultiBranch) plus self_attn_layer_norm, for a layer with
  the 31-tap kernel (every bertjax layer stores the largest kernel's taps)."""
  d, h, k = 248, 4, 31  # embed496: attn:1:248:4 + dynamic:default:248:4, GLU, conv-linear
  attention = 4 * (d * d + d)  # MultiheadAttention's in_proj (3 d x d + 3 d) and out_proj
  dynamic = (d * 2 * d + 2 * d) + d * h * k + (d * d + d)  # linear1 (GLU: d -> 2d), weight_linear (no bias), linear2
  assert _block_params("configs/lite.py:embed496") == attention + dynamic + 2 * 2 * d
  d = 80  # embed160: attn:1:80:4 + lightweight:default:80:4, no GLU
  lightweight = (d * d + d) + h * k + (d * d + d)  # linear1, weight [H, 1, K], linear2
  assert _block_params("configs/lite.py:embed160") == 4 * (d * d + d) + lightweight + 2 * 2 * d


def test_flops_count_both_branches():
  c = _config(hidden_size=64, lsra_kernel_sizes=(3, 7, 7))
  half = 32  # attention: 4 projections at half width and QK, PV over 32 keys; the conv: Linears (GLU doubles the
  # first), the dynamic kernels' Linear (2 heads x 7 taps) and the band matrix over the 32-token row
  want = 2 * 4 * half * half + 2 * 2 * 32 * half + 2 * half * half * 3 + 2 * half * 2 * 7 + 2 * 32 * half
  assert kinds.of(c, "attention").forward_flops(c, 32, 0) == want
  light = dataclasses.replace(c, lsra_conv="lightweight", lsra_glu=False)
  assert kinds.of(light, "attention").forward_flops(light, 1024, 0) == (
      2 * 4 * half * half + 2 * 2 * 1024 * half + 2 * half * half * 2 + 2 * 7 * half)  # unfolded beyond 512 tokens


def test_config_checks_are_one_line_with_the_fix():
  for variant in ("tiny", "embed496", "embed160"):
    build.validate(load_config(f"configs/lite.py:{variant}"))
  good = micro("configs/lite.py:tiny")
  build.validate(good)
  for key, value, match in (("model.attention", "cudnn", "attention=xla"), ("model.position", "rope", "learned"),
                            ("model.lsra_kernel_sizes", "3,7,15", "one per layer"),
                            ("model.lsra_conv", "depthwise", "lightweight, dynamic"),
                            ("model.hidden_size", 66, "2 x num_heads")):
    with pytest.raises(UserError, match=match):
      build.validate(micro("configs/lite.py:tiny", **{key: value}))
  with pytest.raises(UserError, match="lsra has no transformers equivalent"):
    kinds.hf_family(good.model)
  # What fine-tuning asks (a family's own head or SQuAD path): none, so BERT's; a BERT config keeps its family.
  from bertjax.hf import configs as hf_configs

  assert hf_configs.family_if_any(good) == "" and hf_configs.family_if_any(micro("configs/bert.py:tiny")) == "bert"


@pytest.mark.slow  # a train-step compile (~20 s on two cores); the block's gradient is checked in the normal tier
def test_lsra_trains_on_packed_rows():
  config = micro("configs/lite.py:tiny", batch_size=4, seq_len=32)
  build.validate(config)
  steps = build.make_steps(config, sharding.make_mesh("dp", devices=jax.devices()[:1]), SPM_SPECIAL)
  state = steps.init(jax.random.key(0))
  block = state.params["encoder"]["layers"]["attention"]
  assert block["conv_weights"]["kernel"].shape == (2, 32, 2, 7)  # 2 layers, d_c -> 2 heads x the largest kernel
  rng = np.random.default_rng(0)
  ids = rng.integers(5, config.model.vocab_size, (4, 32)).astype(np.int32)
  groups = np.repeat(np.array([[1] * 20 + [2] * 9 + [0] * 3]), 4, axis=0).astype(np.int32)
  positions = np.concatenate([np.arange(20), np.arange(9), np.zeros(3)])[None].repeat(4, 0).astype(np.int32)
  batch = dict(input_ids=ids, type_ids=np.zeros_like(ids), word_start=rng.random((4, 32)) < 0.7, groups=groups,
               position_ids=positions, sentence_label=np.zeros(4, np.int32), example_weight=np.ones(4, np.float32))
  before = jax.tree.map(np.asarray, block)
  for _ in range(2):  # the first step's learning rate is 0 (warmup)
    state, metrics = steps.train(state, batch)
    assert np.isfinite(float(metrics["loss"].compute()))
  after = state.params["encoder"]["layers"]["attention"]
  for name in ("conv_in", "conv_weights", "conv_out", "query"):
    assert not np.array_equal(before[name]["kernel"], np.asarray(after[name]["kernel"])), name
