"""Objectives and their registry; ELECTRA's corruption and the gradient path through the sampler."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import objectives
from bertjax.core import sharding
from bertjax.data.tokenizer import SPM_SPECIAL
from bertjax.model import pretrain
from bertjax.train import build, step as step_lib
from conftest import micro

B, S = 4, 64


def _batch(config, seed=0):
  rng = np.random.default_rng(seed)
  ids = rng.integers(5, config.model.vocab_size, (B, S)).astype(np.int32)
  ids[:, 0], ids[:, S // 2], ids[:, -1] = 2, 3, 3
  types = np.zeros((B, S), np.int32)
  types[:, S // 2 + 1:] = 1
  return dict(input_ids=jnp.asarray(ids), type_ids=jnp.asarray(types), groups=jnp.ones((B, S), jnp.int32),
              word_start=jnp.ones((B, S), bool), sentence_label=jnp.asarray(rng.integers(0, 2, B), jnp.int32),
              example_weight=jnp.ones(B, jnp.float32))


def _setup(config):
  model = build.make_model(config)
  params = sharding.strip_boxes(model.init({"params": jax.random.key(0), "sample": jax.random.key(1),
                                            "dropout": jax.random.key(2)}, build.dummy_batch(config))["params"])
  cfg = build.step_config(config, SPM_SPECIAL, build.placeholder_counts(config))  # SpanBERT draws by corpus counts
  return model, params, cfg


@pytest.mark.slow  # > 15 s cold: the normal tier stays under 8 minutes (README)
def test_masked_positions_sampled_as_the_original_are_labelled_original(monkeypatch):
  config = micro("configs/electra.py:tiny", seq_len=S)
  model, params, cfg = _setup(config)
  batch = step_lib.apply_masking(jax.random.key(3), _batch(config), cfg)
  # The "generator" returns the original token at even slots and a different token at odd slots.
  def fake_sample(rng, logits, temperature):
    labels = batch["mlm_labels"]
    other = jnp.where(labels == 5, 6, 5)
    return jnp.where(jnp.arange(labels.shape[1]) % 2 == 0, labels, other)
  monkeypatch.setattr(pretrain, "sample_tokens", fake_sample)
  out = model.apply({"params": params}, batch, rngs={"sample": jax.random.key(0)})
  labels = np.asarray(out["rtd_labels"])
  pos, w = np.asarray(batch["mlm_positions"]), np.asarray(batch["mlm_weights"])
  for b in range(B):
    real = w[b] > 0
    even = real & (np.arange(len(real)) % 2 == 0)
    odd = real & (np.arange(len(real)) % 2 == 1)
    assert even.any() and odd.any()
    assert (labels[b, pos[b][even]] == 0).all(), "a masked slot sampled as the original was labelled replaced"
    assert (labels[b, pos[b][odd]] == 1).all()
    untouched = np.ones(S, bool)
    untouched[pos[b][real]] = False
    assert (labels[b, untouched] == 0).all()


@pytest.mark.slow  # a long compile or CLI run: the normal tier stays under 8 minutes cold
def test_discriminator_loss_does_not_reach_the_generator_through_sampling():
  config = micro("configs/electra.py:tiny", seq_len=S)
  config.objectives.mlm = 0.0  # RTD alone: only the sampling connects it to the generator
  model, params, cfg = _setup(config)
  cfg = step_lib.StepConfig(**{**cfg.__dict__, "objectives": (("rtd", 50.0),)})
  batch = step_lib.apply_masking(jax.random.key(3), _batch(config), cfg)
  grads = jax.grad(lambda p: step_lib._loss_fn(p, batch, jax.random.key(0), model, cfg, deterministic=True)[0])(params)
  gen = [np.abs(np.asarray(g)).max() for g in jax.tree.leaves({k: grads[k] for k in ("generator_encoder", "generator_mlm")})]
  disc = [np.abs(np.asarray(g)).max() for g in jax.tree.leaves(grads["encoder"])]
  assert max(gen) == 0.0, "RTD gradient leaked into the generator"
  assert max(disc) > 0.0 and np.abs(np.asarray(grads["embeddings"]["word"])).max() > 0  # shared embeddings learn


def test_generator_mlm_loss_trains_the_generator():
  config = micro("configs/electra.py:tiny", seq_len=S)
  model, params, cfg = _setup(config)
  cfg = step_lib.StepConfig(**{**cfg.__dict__, "objectives": (("mlm", 1.0),)})
  batch = step_lib.apply_masking(jax.random.key(3), _batch(config), cfg)
  grads = jax.grad(lambda p: step_lib._loss_fn(p, batch, jax.random.key(0), model, cfg, deterministic=True)[0])(params)
  assert max(np.abs(np.asarray(g)).max() for g in jax.tree.leaves(grads["generator_encoder"])) > 0


@pytest.mark.parametrize("spec,weights,expected_outputs", [
    ("configs/bert.py:tiny", {"mlm": 1.0, "nsp": 1.0}, {"mlm_logits", "sentence_logits"}),
    ("configs/albert.py:tiny", {"mlm": 1.0, "sop": 1.0}, {"mlm_logits", "sentence_logits"}),
    ("configs/electra.py:tiny", {"mlm": 1.0, "rtd": 50.0}, {"mlm_logits", "rtd_logits", "rtd_labels",
                                                             "rtd_input_ids"}),
    ("configs/electra.py:tiny", {"mlm": 1.0, "rtd": 50.0, "sop": 1.0}, {"mlm_logits", "rtd_logits", "rtd_labels",
                                                                         "rtd_input_ids", "sentence_logits"}),
    ("configs/roberta.py:tiny", {"mlm": 1.0}, {"mlm_logits"}),
    ("configs/spanbert.py:tiny", {"mlm": 1.0, "sbo": 1.0}, {"mlm_logits", "sbo_logits"}),
    ("configs/structbert.py:tiny", {"mlm": 1.0, "wso": 1.0, "sso": 1.0}, {"mlm_logits", "wso_logits",
                                                                          "sentence_logits"}),
    ("configs/electra.py:tiny", {"mlm": 1.0, "rtd": 50.0, "sso": 1.0}, {"mlm_logits", "rtd_logits", "rtd_labels",
                                                                         "rtd_input_ids", "sentence_logits"}),
])
def test_registry_combinations_weight_and_sum(spec, weights, expected_outputs):
  config = micro(spec, seq_len=S)
  for k in config.objectives:
    config.objectives[k] = weights.get(k, 0.0)
  model, params, cfg = _setup(config)
  batch = step_lib.apply_masking(jax.random.key(0), _batch(config), cfg)
  out = model.apply({"params": params}, batch, rngs={"sample": jax.random.key(0)})
  assert set(out) == expected_outputs
  total, metrics = objectives.total_loss(weights, out, batch)
  parts = {name: _reference_loss(name, out, batch) for name in weights}
  np.testing.assert_allclose(float(total), sum(w * parts[name] for name, w in weights.items()), rtol=1e-5)
  for name in weights:  # each objective's own mean loss, as its metric reports it
    m = metrics[f"{name}_loss"]
    np.testing.assert_allclose(float(m.total) / float(m.count), parts[name], rtol=1e-5)
  for name in weights:
    assert f"{name}_loss" in metrics and f"{name}_accuracy" in metrics or name == "rtd"
  if "sso" in weights:
    assert out["sentence_logits"].shape == (B, 3)


def _xent(logits, labels, weights):
  """Weighted mean cross-entropy over the last axis, in NumPy (float64)."""
  logits, weights = np.asarray(logits, np.float64), np.asarray(weights, np.float64)
  top = logits.max(-1, keepdims=True)
  logz = np.log(np.exp(logits - top).sum(-1)) + top[..., 0]
  picked = np.take_along_axis(logits, np.asarray(labels)[..., None], axis=-1)[..., 0]
  return float(((logz - picked) * weights).sum() / weights.sum())


def _reference_loss(name, out, batch):
  """Each objective's mean loss written from its paper's definition over the model's outputs, not through
  bertjax.objectives: which logits, which labels, which slots count."""
  b = jax.tree.map(np.asarray, batch)
  if name == "mlm":
    return _xent(out["mlm_logits"], b["mlm_labels"], b["mlm_weights"])
  if name == "sbo":  # SpanBERT: slots whose span has text boundaries, within the first 15 tokens of the span
    offset = b["mlm_positions"] - b["span_left"] - 1  # (--max-pair-targets 15, pretraining/README.md)
    return _xent(out["sbo_logits"], b["mlm_labels"], b["span_weights"] * (offset < 15))
  if name == "wso":  # StructBERT: the original token at every shuffled position
    return _xent(out["wso_logits"], b["wso_labels"], b["wso_weights"])
  if name in ("nsp", "sop", "sso"):
    return _xent(out["sentence_logits"], b["sentence_label"], b["example_weight"])
  if name == "rtd":  # ELECTRA: sigmoid BCE over every real token
    x, y = np.asarray(out["rtd_logits"], np.float64), np.asarray(out["rtd_labels"], np.float64)
    w = (b["groups"] > 0) * b["example_weight"][:, None]
    bce = np.maximum(x, 0) - x * y + np.log1p(np.exp(-np.abs(x)))
    return float((bce * w).sum() / w.sum())
  raise KeyError(name)


def test_sbo_logits_depend_on_the_span_boundaries_and_nothing_else():
  """SpanBERT's SBO logits come from the encoder outputs at the two tokens just outside a span (and the
  target's position in it): through the whole model, changing a boundary's final hidden state changes the
  span's logits; changing any other token's, inside the span or outside it, leaves them exactly as they were."""
  from flax import linen as nn

  config = micro("configs/spanbert.py:tiny", seq_len=16, **{"model.num_layers": 1, "model.vocab_size": 50})
  model, params, _ = _setup(config)
  ids = np.random.default_rng(0).integers(5, 50, (1, 16)).astype(np.int32)
  ids[0, 0], ids[0, 15] = 2, 3
  batch = dict(input_ids=jnp.asarray(ids), type_ids=jnp.zeros((1, 16), jnp.int32), groups=jnp.ones((1, 16), jnp.int32),
               mlm_positions=jnp.asarray([[3, 4, 5, 10]]), mlm_weights=jnp.ones((1, 4)),
               span_left=jnp.asarray([[2, 2, 2, 9]]), span_right=jnp.asarray([[6, 6, 6, 11]]))  # spans 3-5, 10

  def sbo_logits(pos):
    def bump(next_fun, args, kwargs, context):  # +1 on the final hidden state at `pos`
      out = next_fun(*args, **kwargs)
      return out.at[0, pos].add(1.0) if context.method_name == "encode" and pos is not None else out

    with nn.intercept_methods(bump):
      return np.asarray(model.apply({"params": params}, batch)["sbo_logits"])

  base = sbo_logits(None)
  assert np.abs(base[0, 0] - base[0, 1]).max() > 1e-4  # same boundaries, another position in the span
  for pos in (2, 6):  # the boundaries of span 3-5
    changed = sbo_logits(pos)
    assert (np.abs(changed[0, :3] - base[0, :3]).max(-1) > 1e-4).all(), pos  # every slot of the span
    np.testing.assert_array_equal(changed[0, 3], base[0, 3])  # the other span's logits stay
  for pos in (0, 3, 4, 5, 7, 13):  # inside the span, or neither boundary
    np.testing.assert_array_equal(sbo_logits(pos)[0, :3], base[0, :3])

# The top-level parameter groups of a model with every head the BERT variants add, and the groups each
# objective's gradient may reach (besides the encoder and the embeddings, which all of them train).
HEADS = ("mlm", "sbo_head", "sentence")
USES = {"mlm": {"mlm"}, "sbo": {"sbo_head"}, "wso": {"mlm"}, "sso": {"sentence"}}


def test_gradients_reach_only_the_heads_each_objective_uses():
  config = micro("configs/spanbert.py:tiny", seq_len=S, **{"model.num_layers": 1, "objectives.wso": 1.0,
                                                           "objectives.sso": 1.0})
  model, params, cfg = _setup(config)
  labels = _batch(config)
  labels["sentence_label"] = jnp.asarray([0, 1, 2, 1], jnp.int32)
  batch = step_lib.apply_masking(jax.random.key(3), labels, cfg)
  assert float(batch["span_weights"].sum()) > 0 and float(batch["wso_weights"].sum()) > 0
  names = sorted(USES)

  def losses(p):
    out = model.apply({"params": p}, batch)
    return jnp.stack([objectives.REGISTRY[n].loss(out, batch)[0] for n in names])

  jac = jax.jit(jax.jacrev(losses))(params)  # one compile: the gradient of each loss
  for i, name in enumerate(names):
    size = {k: max(float(jnp.abs(g[i]).max()) for g in jax.tree.leaves(jac[k])) for k in HEADS + ("encoder",)}
    assert size["encoder"] > 0, name
    for head in HEADS:
      assert (size[head] > 0) == (head in USES[name]), (name, head, size[head])


def test_auc_from_histograms_matches_pairwise_definition():
  from bertjax.core.metrics import AUC

  rng = np.random.default_rng(0)
  pos_scores, neg_scores = rng.beta(3, 2, 500), rng.beta(2, 3, 700)
  exact = (pos_scores[:, None] > neg_scores[None]).mean()
  bins = 1000
  hist = lambda s: np.bincount(np.minimum((s * bins).astype(int), bins - 1), minlength=bins)
  assert abs(AUC(hist(pos_scores), hist(neg_scores)).compute() - exact) < 2e-3
  assert AUC(hist(neg_scores), hist(pos_scores)).compute() < 0.5


def test_sampling_temperature_flattens_the_generator_distribution():
  """Gumbel-max at temperature T samples softmax(logits / T): its empirical frequencies match."""
  logits = jnp.log(jnp.array([0.7, 0.2, 0.1]))
  n = 40_000
  for t in (1.0, 2.0):
    samples = pretrain.sample_tokens(jax.random.key(0), jnp.broadcast_to(logits, (n, 3)), t)
    freq = np.bincount(np.asarray(samples), minlength=3) / n
    np.testing.assert_allclose(freq, jax.nn.softmax(logits / t), atol=0.01)
