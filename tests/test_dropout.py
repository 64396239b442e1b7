"""Dropout masks (bertjax.model.dropout): each generator of model.dropout_rng draws Bernoulli(keep) masks whose
neighbours, steps and layers are uncorrelated, cut a shorter input's mask from the full length's, and is the one
the model's Dropout uses; `auto` resolves per platform and a bad name is refused in one line."""

import dataclasses
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import stats

from bertjax.core import saved
from bertjax.core.errors import UserError
from bertjax.finetune import train as finetune_train
from bertjax.model import config as model_config
from bertjax.model.dropout import Dropout, GENERATORS, keep_mask, token_dropout
from bertjax.model.hparams import EncoderConfig
from conftest import devices, load_config, REPO

SHAPE = (64, 8, 1000)  # 512k draws: a keep rate's std 4e-4, a correlation's std 1.4e-3


def corr(a, b) -> float:
  return float(np.corrcoef(np.ravel(a), np.ravel(b))[0, 1])


_keep_mask = jax.jit(keep_mask, static_argnums=(1, 2, 3, 4))  # one compile per shape, not one per op


def mask(key, shape=SHAPE, keep=0.9, generator="threefry", full_shape=None):
  return np.asarray(_keep_mask(key, shape, keep, full_shape, generator))


@pytest.fixture(scope="module", params=GENERATORS)
def drawn(request):
  """(generator, its mask of SHAPE at keep 0.9 for key(0))."""
  return request.param, mask(jax.random.key(0), generator=request.param).astype(np.float64)


def test_keep_rate_and_uncorrelated_neighbours(drawn):
  """The keep rate is keep_prob, and neighbours along every axis (threefry: four of them share a hash) are
  uncorrelated, as are elements 4, 16 and 256 apart on the last axis."""
  _, m = drawn
  assert m.shape == SHAPE and abs(m.mean() - 0.9) < 0.002
  for axis in range(3):
    a = np.moveaxis(m, axis, 0)
    assert abs(corr(a[1:], a[:-1])) < 0.01, axis
  for lag in (4, 16, 256):
    assert abs(corr(m[..., lag:], m[..., :-lag])) < 0.01, lag


def test_steps_layers_and_keys_give_uncorrelated_masks(drawn):
  """Consecutive steps (the step folded into the key), layers (split keys, as nn.scan splits the dropout
  stream) and other seeds draw masks uncorrelated with key(0)'s."""
  generator, m = drawn
  key = jax.random.key(0)
  others = {"step 1": jax.random.fold_in(key, 1), "step 2": jax.random.fold_in(key, 2),
            "layer 0": jax.random.split(key)[0], "layer 1": jax.random.split(key)[1], "seed 1": jax.random.key(1)}
  for name, other in others.items():
    o = mask(other, generator=generator).astype(np.float64)
    assert abs(corr(m, o)) < 0.01 and (o != m).mean() > 0.15, name  # independent: 2 x 0.9 x 0.1 differ


def test_serial_patterns_are_uniform(drawn):
  """At keep 0.5, the 16 patterns of 4 consecutive draws, along the last axis and along the first, are
  equally frequent (chi-square, 16 cells)."""
  generator, _ = drawn
  m = mask(jax.random.key(4), (256, 4096), 0.5, generator).astype(np.int64)
  for rows in (m, m.T):
    codes = rows.reshape(-1, 4) @ np.array([1, 2, 4, 8])
    assert stats.chisquare(np.bincount(codes, minlength=16)).pvalue > 1e-4


@pytest.mark.parametrize("generator", GENERATORS)
def test_a_shorter_input_s_mask_is_the_full_length_s_corner(generator):
  """Drawn for a larger full shape, the mask is that shape's mask cut to the corner (any lengths, a smaller
  batch too), and an odd last length works."""
  full = mask(jax.random.key(3), (2, 3, 24, 24), generator=generator)
  for shape in ((2, 3, 8, 8), (2, 3, 13, 13), (2, 3, 24, 5), (1, 3, 17, 24)):
    corner = mask(jax.random.key(3), shape, generator=generator, full_shape=(2, 3, 24, 24))
    np.testing.assert_array_equal(corner, full[tuple(slice(n) for n in shape)])
  odd = mask(jax.random.key(2), (3, 4001), 0.5, generator)
  assert odd.shape == (3, 4001) and abs(odd.mean() - 0.5) < 0.02


def test_the_model_s_dropout_draws_the_config_s_generator():
  """token_dropout uses EncoderConfig.dropout_rng: the kept positions are keep_mask's for the key the
  module draws, drawn at dropout_length and cut; the two generators' masks differ."""
  x = jnp.ones((2, 12, 8))
  key = jax.random.key(5)
  kept = {}
  for generator in GENERATORS:
    c = EncoderConfig(vocab_size=8, hidden_size=8, num_layers=1, num_heads=1, intermediate_size=8, embedding_size=8,
                      dropout_length=16, dropout_rng=generator)
    drop = token_dropout(c, 0.5)
    rng = drop.apply({}, rngs={"dropout": key}, method=lambda m: m.make_rng("dropout"))
    out = np.asarray(drop.apply({}, x, False, rngs={"dropout": key}))
    kept[generator] = out != 0
    np.testing.assert_array_equal(kept[generator], mask(rng, x.shape, 0.5, generator, (2, 16, 8)))
    np.testing.assert_allclose(out[kept[generator]], 2.0)
  assert (kept["threefry"] != kept["lowbias32"]).any()
  assert Dropout(0.1).generator == "threefry"  # modules built without a config keep the reference


def test_dropout_rng_resolves_per_platform_and_bad_names_are_refused():
  """auto: lowbias32 on the CPU (measured faster), threefry elsewhere; a name is kept; an unknown one is a
  one-line UserError naming the key and the choices; a saved run that predates the key drew threefry masks."""
  assert model_config.dropout_rng("auto", "cpu") == "lowbias32"
  assert model_config.dropout_rng("auto", "gpu") == model_config.dropout_rng("auto", "tpu") == "threefry"
  assert model_config.dropout_rng("threefry", "cpu") == "threefry"
  c = load_config("configs/bert.py:tiny")
  assert model_config.encoder_config(c.model, platform="cpu").dropout_rng == "lowbias32"
  c.model.dropout_rng = "threefry"
  assert model_config.encoder_config(c.model, platform="cpu").dropout_rng == "threefry"
  c.model.dropout_rng = "philox"
  with pytest.raises(UserError) as err:
    model_config.validate(c)
  assert "\n" not in str(err.value) and "model.dropout_rng='philox'" in str(err.value)
  assert "threefry, lowbias32" in str(err.value)
  tune = load_config("configs/finetune.py:sst2")  # fine-tuning configs choose their own generator
  tune.init.checkpoint, tune.model.dropout_rng = "unused", "philox"
  with pytest.raises(UserError, match="model.dropout_rng='philox'; use one of auto, threefry, lowbias32"):
    finetune_train.validate(tune)
  old = {"model": {k: v for k, v in c.model.to_dict().items() if k != "dropout_rng"}}
  assert saved.from_saved(old).model.dropout_rng == "threefry"
  assert {f.name: f.default for f in dataclasses.fields(EncoderConfig)}["dropout_rng"] == "threefry"


SHARDED = """
import jax, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
from bertjax.model.dropout import GENERATORS, keep_mask
mesh = Mesh(np.array(jax.devices()).reshape(2, 2), ("data", "model"))
shape = (4, 6, 16, 16)
for g in GENERATORS:
  for spec, full in ((P("data", "model"), None), (P("data", None, "model"), (4, 6, 24, 24))):
    f = jax.jit(lambda k: keep_mask(k, shape, 0.9, full, g), out_shardings=NamedSharding(mesh, spec))
    hlo = f.lower(jax.random.key(0)).compile().as_text()
    assert not any(c in hlo for c in ("all-gather", "all-reduce", "collective-permute", "all-to-all")), (g, spec)
    ref = keep_mask(jax.random.key(0), shape, 0.9, full, g)
    np.testing.assert_array_equal(np.asarray(f(jax.random.key(0))), np.asarray(ref))
print("ok")
"""


@pytest.mark.slow  # a subprocess with 4 CPU devices (~5 s)
def test_masks_shard_like_the_activations():
  """On a 2 x 2 mesh, a mask sharded over its leading dimensions (batch and heads, or batch and positions of a
  bucketed input) is the unsharded mask, each device drawing its own part: no collective in the program."""
  proc = subprocess.run([sys.executable, "-c", SHARDED], cwd=REPO, env=dict(os.environ, **devices(4)),
                        capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]
