"""The encoder and pretraining model: parameter counts as published, sharing modes, masks, dtypes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from bertjax import summary
from bertjax.core import sharding
from bertjax.model.embeddings import Embeddings
from bertjax.model.encoder import Encoder
from bertjax.model.hparams import EncoderConfig
from bertjax.train import build
from conftest import encoder_only, load_config

# HF transformers' counts for the same configs (BertForPreTraining, AlbertForPreTraining,
# ElectraForPreTraining discriminators, RobertaForMaskedLM).
COUNTS = [
    ("configs/bert.py:base", {}, 110106428),
    ("configs/bert.py:large", {}, 336226108),
    ("configs/albert.py:base", {}, 11813810),
    ("configs/albert.py:large", {}, 17847474),
    ("configs/albert.py:xlarge", {}, 59021490),
    ("configs/albert.py:xxlarge", {}, 223158450),
    ("configs/albert.py:base", {"sharing": "none"}, 89780402),
    ("configs/roberta.py:base", {}, 124697433),
    ("configs/roberta.py:large", {}, 355412057),
]


@pytest.mark.parametrize("spec,model_overrides,expected", COUNTS)
def test_parameter_counts_match_published_models(spec, model_overrides, expected):
  c = load_config(spec)
  c.model.update(model_overrides)
  params = build.param_shapes(c)
  assert summary.count(params) == expected


@pytest.mark.parametrize("variant,expected", [("small", 13549057), ("base", 109483009), ("large", 335142913)])
def test_electra_discriminator_counts(variant, expected):
  text = summary.summarize(load_config(f"configs/electra.py:{variant}"))
  assert f"discriminator params: {expected}" in text


def _encoder(sharing, groups=1, layers=4, remat="none", dtype=jnp.float32):
  return EncoderConfig(vocab_size=50, hidden_size=32, num_layers=layers, num_heads=4, intermediate_size=64,
                       embedding_size=16, sharing=sharing, num_groups=groups, remat=remat, dtype=dtype)


def _init(cfg, ids=None):
  ids = jnp.arange(1, 17, dtype=jnp.int32).reshape(2, 8) if ids is None else ids
  variables = encoder_only(cfg).init(jax.random.key(0), ids, (ids > 0).astype(jnp.int32))
  return variables, ids


@pytest.mark.parametrize("sharing,groups,stacked,shared", [
    ("none", 1, {"attention": 4, "ffn": 4}, {}),
    ("all", 1, {}, {"attention": 1, "ffn": 1}),
    ("attention", 1, {"ffn": 4}, {"attention": 1}),
    ("ffn", 1, {"attention": 4}, {"ffn": 1}),
    ("all", 2, {}, {"attention": 2, "ffn": 2}),
])
def test_sharing_modes_shape_the_parameter_tree(sharing, groups, stacked, shared):
  cfg = _encoder(sharing, groups)
  variables, ids = _init(cfg)
  enc = sharding.strip_boxes(variables["params"])["Encoder_0"]
  layers = enc.get("layers", {})
  assert set(layers) == set(stacked)
  for name, n in stacked.items():
    assert enc["layers"][name]["ffn" == name and "intermediate" or "query"]["kernel"].shape[0] == n
  for name, n in shared.items():
    leaves = jax.tree.leaves(enc[name])
    assert all(leaf.shape[0] == n for leaf in leaves)
  out = encoder_only(cfg).apply(variables, ids, (ids > 0).astype(jnp.int32))
  assert out.shape == (2, 8, 32) and np.isfinite(np.asarray(out)).all()
  # Stacked/shared parameters carry the `layers` logical axis, so sharding rules can place them.
  specs = nn.get_partition_spec(variables["params"])["Encoder_0"]
  first = jax.tree.leaves(specs, is_leaf=lambda s: isinstance(s, jax.sharding.PartitionSpec))[0]
  assert sharding.LAYERS in tuple(first) or "embedding_projection" in specs


def test_shared_layers_are_the_same_function():
  """With sharing=all, every layer applies the same parameters: a 4-layer model equals 4 applications
  of the 1-layer model with those parameters."""
  cfg4, cfg1 = _encoder("all", layers=4), _encoder("all", layers=1)
  variables, ids = _init(cfg4)
  out4 = encoder_only(cfg4).apply(variables, ids, jnp.ones_like(ids))
  p = sharding.strip_boxes(variables["params"])
  x = Embeddings(cfg4).apply({"params": p["Embeddings_0"]}, ids, jnp.zeros_like(ids), True)
  x = x @ p["Encoder_0"]["embedding_projection"]["kernel"] + p["Encoder_0"]["embedding_projection"]["bias"]
  enc_p = {k: v for k, v in p["Encoder_0"].items() if k != "embedding_projection"}
  cfg1h = _encoder("all", layers=1)
  cfg1h = EncoderConfig(**{**cfg1h.__dict__, "embedding_size": 32})
  for _ in range(4):
    x = Encoder(cfg1h).apply({"params": enc_p}, x, jnp.ones_like(ids))
  np.testing.assert_allclose(np.asarray(out4), np.asarray(x), atol=1e-5)


@pytest.mark.slow  # a long compile or CLI run: the normal tier stays under 8 minutes cold
def test_unrolled_layers_train_as_the_rolled_scan():
  """How many layers a scan iteration runs (the CPU unrolls them all: model.config.scan_unroll) changes
  neither the parameters, the dropout masks, the loss nor its gradients."""
  from bertjax.model import config as model_config

  assert model_config.scan_unroll(0, 12, "cpu") == 12 and model_config.scan_unroll(0, 12, "tpu") == 0
  assert model_config.scan_unroll(3, 12, "cpu") == 3
  x = jax.random.normal(jax.random.key(0), (2, 8, 16))

  def loss_and_grads(unroll):
    enc = Encoder(EncoderConfig(**{**_encoder("none", layers=5).__dict__, "scan_unroll": unroll}), deterministic=False)
    params = enc.init(jax.random.key(0), x, jnp.ones((2, 8), jnp.int32))["params"]
    loss = lambda p: (enc.apply({"params": p}, x, jnp.ones((2, 8), jnp.int32), rngs={"dropout": jax.random.key(1)})
                      ** 2).mean()
    return jax.value_and_grad(loss)(params)

  (rolled, g1), (unrolled, g5) = loss_and_grads(1), loss_and_grads(5)
  np.testing.assert_allclose(float(rolled), float(unrolled), rtol=1e-6)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-6), g1, g5)


LAST_LAYER_CASES = {
    "bert": {},
    "albert_shared": dict(sharing="all", num_groups=1),
    "modernbert": dict(norm="pre", position="rope", ffn="geglu", use_bias=False, local_layers=(True, False, True),
                       local_window=4),
    "one_layer": dict(num_layers=1),
}


# The shared-block and one-layer stacks compile the same path a second and third time: the slow tier checks them.
@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in ("albert_shared", "one_layer") else c
                                  for c in sorted(LAST_LAYER_CASES)])
def test_a_cls_classifier_s_last_layer_computes_only_cls_and_gives_the_full_stack_s_logits_and_gradients(case):
  """A [CLS]-pooled classifier asks the encoder for its [CLS] rows only (Encoder `outputs_at`): the last layer
  then computes those queries alone (fewer FLOPs), and logits and gradients (head gates' included) equal the full
  stack's, which runs whenever a pass needs every position (here: sown intermediates). Packed rows too."""
  from bertjax.finetune.classification.model import Classifier

  fields = dict(vocab_size=50, hidden_size=16, num_layers=3, num_heads=2, intermediate_size=32, embedding_size=16,
                max_positions=32)
  cfg = EncoderConfig(**{**fields, **LAST_LAYER_CASES[case]})
  model = Classifier(cfg, 3, deterministic=True, head="modernbert" if case == "modernbert" else "pooler")
  ids = jax.random.randint(jax.random.key(1), (4, 10), 1, 50)
  groups = (jnp.arange(10)[None] < jnp.array([[10], [7], [3], [9]])).astype(jnp.int32)
  packed_groups = jnp.array([[1] * 4 + [2] * 6, [1] * 7 + [0] * 3, [1] * 3 + [2] * 2 + [0] * 5, [1] * 9 + [0]])
  packed = dict(position_ids=jnp.where(packed_groups == 2, jnp.arange(10) - jnp.array([[4], [0], [3], [0]]),
                                       jnp.arange(10)),
                cls_positions=jnp.array([[0, 4], [0, 0], [0, 3], [0, 0]]))
  params = model.init(jax.random.key(0), ids, ids * 0, groups)["params"]
  gates = jnp.ones((cfg.num_layers, 2)).at[-1, 1].set(0.3)
  for g, extra in ((groups, {}), (packed_groups, packed)):
    split = lambda p, gt: model.apply({"params": p}, ids, ids * 0, g, gt, **extra)
    full = lambda p, gt: model.apply({"params": p}, ids, ids * 0, g, gt, mutable="intermediates", **extra)[0]
    np.testing.assert_allclose(np.asarray(jax.jit(split)(params, gates)), np.asarray(jax.jit(full)(params, gates)),
                               atol=1e-5)
    grads = [jax.jit(jax.grad(lambda p, gt, f=f: (f(p, gt) ** 2).sum(), argnums=(0, 1)))(params, gates)
             for f in (split, full)]
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=1e-5), *grads)
    if not extra:  # the split stack computes less (packed rows run the same code)
      flops = [jax.jit(f).lower(params, gates).compile().cost_analysis()["flops"] for f in (split, full)]
      assert flops[0] < 0.8 * flops[1]
  # Training (dropout on) runs the split stack too, and its loss has gradients everywhere.
  train = model.clone(deterministic=False)
  loss = lambda p: (train.apply({"params": p}, ids, ids * 0, groups, rngs={"dropout": jax.random.key(2)}) ** 2).sum()
  assert all(np.isfinite(np.asarray(x)).all() for x in jax.tree.leaves(jax.jit(jax.grad(loss))(params)))


def test_padding_does_not_change_real_tokens():
  cfg = _encoder("none")
  ids = jnp.array([[5, 6, 7, 8, 0, 0, 0, 0]], jnp.int32)
  variables, _ = _init(cfg, ids)
  groups = (ids > 0).astype(jnp.int32)
  a = encoder_only(cfg).apply(variables, ids, groups)
  ids2 = ids.at[0, 5].set(9)  # change a padded position's token; it stays masked out
  b = encoder_only(cfg).apply(variables, ids2, groups)
  np.testing.assert_allclose(np.asarray(a[0, :4]), np.asarray(b[0, :4]), atol=1e-6)


def test_remat_and_bf16_run_and_agree():
  ids = jnp.arange(1, 17, dtype=jnp.int32).reshape(2, 8)
  base, _ = _init(_encoder("none"), ids)
  ref = encoder_only(_encoder("none")).apply(base, ids, jnp.ones_like(ids))
  remat = encoder_only(_encoder("none", remat="full")).apply(base, ids, jnp.ones_like(ids))
  np.testing.assert_allclose(np.asarray(ref), np.asarray(remat), atol=1e-6)
  bf16 = encoder_only(_encoder("none", dtype=jnp.bfloat16)).apply(base, ids, jnp.ones_like(ids))
  assert bf16.dtype == jnp.bfloat16
  np.testing.assert_allclose(np.asarray(ref), np.asarray(bf16, np.float32), atol=0.1)
