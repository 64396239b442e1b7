"""The Tree Transformer's constituent attention (bertjax.model.constituent) and its parser (bertjax.compress.trees):
the spec sheet's hand-computed values, a NumPy transcription of the authors' full-matrix GroupAttention over two
layers, packed rows against separate ones, the fused kernels' refusal, and the parse of given break probabilities."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from bertjax.compress import trees
from bertjax.core.errors import UserError
from bertjax.data.tokenizer import SpecialIds
from bertjax.model import constituent
from bertjax.model.encoder import Encoder
from bertjax.model.hparams import EncoderConfig
from bertjax.model.layer import sown_by_layers


def reference_group_attention(q, k, valid, prior, scale=256.0):
  """The authors' GroupAttention after its projections, as full [S, S] matrices (one example): neighbour softmax
  with -1e9 on masked keys, the symmetric sqrt link, the prior, then the log / triangular-matmul product."""
  s = q.shape[0]
  a = np.eye(s, k=1)
  b = np.eye(s)
  c = np.eye(s, k=-1)
  tri = np.triu(np.ones((s, s)))
  mask = valid[None, :] * (a + c)
  scores = np.where(mask == 0, -1e9, q @ k.T / scale)
  p = np.exp(scores - scores.max(-1, keepdims=True))
  p = p / p.sum(-1, keepdims=True)
  neighbour = np.sqrt(p * p.T + 1e-9)
  neighbour = prior + (1.0 - prior) * neighbour
  t = np.where(a == 0, 0.0, np.log(neighbour + 1e-9)) @ tri
  g = np.where(tri - b == 0, 0.0, np.exp(tri @ t))
  g = g + g.T + np.where(b == 0, 1e-9, neighbour)
  return g, neighbour


def _layer(q, k, groups, prior):
  right, left = constituent.neighbour_probs(jnp.asarray(q)[None], jnp.asarray(k)[None], jnp.asarray(groups)[None], 256.0)
  a, d = constituent.break_probs(right, left, prior)
  return a, d, constituent.constituent_prior(a, d)


def test_spec_sheet_values_and_a_second_layer_match_the_reference():
  q = 16.0 * np.array([[1, 0], [0, 1], [1, 1]], np.float32)
  k = 16.0 * np.array([[0, 1], [1, 0], [1, 1]], np.float32)
  zeros = (jnp.zeros((1, 3)), jnp.zeros((1, 3)))
  a, d, prior = _layer(q, k, np.ones(3, np.int32), zeros)
  # The spec sheet's hand-computed values (iclr2020_variants.md §2 (f)).
  np.testing.assert_allclose(np.asarray(a)[0, :2], [0.70710678, 0.70710678], rtol=1e-6)
  np.testing.assert_allclose(np.asarray(prior)[0, 0, 2], 0.5, rtol=1e-6)
  np.testing.assert_allclose(np.diagonal(np.asarray(prior)[0]), 3.1623e-5, rtol=1e-4)
  ref_c, ref_n = reference_group_attention(q.astype(np.float64), k.astype(np.float64), np.ones(3), 0.0)
  np.testing.assert_allclose(np.asarray(prior)[0], ref_c, rtol=1e-5)
  # A second layer with the first's output as its prior (the reference carries its whole C).
  q2, k2 = 16.0 * np.array([[1, 1], [1, 0], [0, 1]], np.float32), 16.0 * np.array([[1, 0], [1, 1], [0, 1]], np.float32)
  state = (jnp.exp(jnp.log(a + 1e-9)) + 1e-9, d)
  a2, _, prior2 = _layer(q2, k2, np.ones(3, np.int32), state)
  ref_c2, ref_n2 = reference_group_attention(q2.astype(np.float64), k2.astype(np.float64), np.ones(3), ref_c)
  np.testing.assert_allclose(np.asarray(a2)[0, :2], np.diagonal(ref_n2, 1), rtol=1e-5)
  np.testing.assert_allclose(np.asarray(prior2)[0], ref_c2, rtol=1e-5)
  assert np.all(np.asarray(a2)[0, :2] >= np.asarray(a)[0, :2])  # the hierarchical constraint: links only grow


def test_random_rows_with_padding_match_the_reference_over_two_layers():
  rng = np.random.default_rng(0)
  s, n = 7, 5  # two padding tokens at the end
  groups = np.array([1] * n + [0] * (s - n), np.int32)
  state = (jnp.zeros((1, s)), jnp.zeros((1, s)))
  ref_prior = 0.0
  for _ in range(2):
    q, k = (rng.normal(size=(s, 4)).astype(np.float32) * 12 for _ in range(2))
    a, d, prior = _layer(q, k, groups, state)
    ref_c, ref_n = reference_group_attention(q.astype(np.float64), k.astype(np.float64), (groups > 0) * 1.0, ref_prior)
    np.testing.assert_allclose(np.asarray(a)[0, :n], np.diagonal(ref_n, 1)[:n], rtol=2e-5)
    np.testing.assert_allclose(np.asarray(prior)[0, :n, :n], ref_c[:n, :n], rtol=2e-5, atol=1e-12)
    state, ref_prior = (jnp.exp(jnp.log(a + 1e-9)) + 1e-9, d), ref_c


CFG = EncoderConfig(vocab_size=50, hidden_size=16, num_layers=2, num_heads=2, intermediate_size=32, embedding_size=16,
                    dropout=0.0, attention_dropout=0.0, attention_kind="constituent", constituent_scale=2.0)


def _sown(sown, key):
  """What every layer sowed under `key`, from an Encoder's own apply (sown_by_layers reads a Pretrainer's)."""
  return np.asarray(sown_by_layers({"intermediates": {"encoder": sown["intermediates"]}}, key))


def _run(cfg, params, x, groups):
  out, sown = Encoder(cfg).apply(params, x, groups, mutable="intermediates")
  return np.asarray(out), _sown(sown, "break_probs")


def test_packed_examples_equal_separate_ones_and_rows_sum_as_each_switch_says():
  x = jax.random.normal(jax.random.key(0), (1, 8, 16))
  packed = jnp.array([[1] * 5 + [2] * 3])
  params = Encoder(CFG).init(jax.random.key(1), x, packed)
  out, links = _run(CFG, params, x, packed)
  first, first_links = _run(CFG, params, x[:, :5], jnp.ones((1, 5), jnp.int32))
  second, second_links = _run(CFG, params, jnp.pad(x[:, 5:], ((0, 0), (0, 2), (0, 0))), jnp.array([[1] * 3 + [0] * 2]))
  np.testing.assert_allclose(out[:, :5], first, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out[:, 5:], second[:, :3], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(links[:, 0, :5], first_links[:, 0], rtol=1e-5)
  np.testing.assert_allclose(links[:, 0, 5:], second_links[:, 0, :3], rtol=1e-5)
  assert links.shape == (2, 1, 8) and np.all(np.diff(links[:, 0, :4], axis=0) >= 0)  # carried up the stack
  # A row of C x softmax sums to less than 1 in the code's form, to 1 when renormalized.
  for renormalize in (False, True):
    cfg = dataclasses.replace(CFG, constituent_renormalize=renormalize)
    probs = _sown(Encoder(cfg).apply(params, x, packed, mutable="intermediates")[1], "attention_probs")
    sums = probs[..., :5, :].sum(-1)
    assert np.allclose(sums, 1.0, atol=1e-5) == renormalize and np.all(sums <= 1 + 1e-5)


def test_fused_kernels_are_refused_with_one_line():
  from bertjax.core.config import defaults
  from bertjax.model import config as model_config

  c = defaults()
  c.model.attention_kind, c.model.attention, c.model.attention_dropout = "constituent", "cudnn", 0.0
  c.model.dtype = "bfloat16"
  with pytest.raises(UserError, match="constituent.*model.attention=cudnn cannot; use --config.model.attention=xla"):
    model_config.validate(c)
  c.model.attention = "auto"  # auto runs xla for a kind no fused kernel can run, on every platform
  assert model_config.encoder_config(c.model, platform="gpu").attention == "xla"
  c.model.attention_kind = "mha"
  assert model_config.encoder_config(c.model, platform="gpu").attention == "cudnn"


def test_parse_follows_the_reference_procedure():
  leaves = ["the", "cat", "sat", "on", "the", "mat"]
  # One layer read (min layer 0 for a 1-layer model): the weakest link (sat|on) splits, then each side.
  breaks = np.array([[0.9, 0.5, 0.1, 0.6, 0.95]])
  tree = trees.parse(breaks, leaves)
  assert tree == [[["the", "cat"], "sat"], ["on", ["the", "mat"]]]
  assert trees.bracketed(tree) == "(((the cat) sat) (on (the mat)))"
  # Every link above the threshold at the lowest layer read: one flat constituent.
  assert trees.bracketed(trees.parse(np.full((3, 5), 0.9), leaves)) == "(the cat sat on the mat)"
  assert trees.bracketed(trees.parse(np.zeros((1, 0)), ["word"])) == "(word)"


class _WordTokenizer:
  """Whitespace words as ids 5.. (enough of bertjax's Tokenizer for encode_example and the leaves)."""

  special = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)

  def __init__(self, words):
    self.ids = {w: i + 5 for i, w in enumerate(words)}
    self.words = {i: w for w, i in self.ids.items()}

  def encode(self, text):
    return (np.array([self.ids[w] for w in text.split()]),)

  def id_to_token(self, i):
    return self.words[i]


def test_trees_prints_one_bracketed_tree_per_sentence_of_its_own_words():
  from bertjax.core.config import defaults
  from bertjax.hf.inference import Loaded
  from bertjax.train import build

  c = defaults()
  m = c.model
  m.vocab_size, m.hidden_size, m.num_layers, m.num_heads, m.intermediate_size = 32, 16, 3, 2, 32
  m.attention_kind, m.attention, m.max_positions = "constituent", "xla", 32
  sentences = ["the cat sat on the mat", "dogs bark", "a b c d e f g"]
  tok = _WordTokenizer(sorted({w for s in sentences for w in s.split()}))
  ids = jnp.ones((1, 4), jnp.int32)
  params = nn.unbox(build.make_model(c).init(jax.random.key(0), ids, ids, ids, method="encode"))["params"]
  lines = trees.trees(Loaded(c, params, tok), sentences, batch_size=2)
  assert len(lines) == 3
  for line, sentence in zip(lines, sentences):
    assert line.startswith("(") and line.count("(") == line.count(")")
    assert line.replace("(", " ").replace(")", " ").split() == sentence.split()
