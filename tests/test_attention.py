"""Attention implementations (model.attention): each one equals the xla path, keeps packed examples apart and
padding out, and the choice between them follows the platform and attention dropout."""

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from bertjax.core.errors import UserError
from bertjax.model import attention as attention_lib, config as model_config, mha
from bertjax.model.embeddings import Embeddings
from bertjax.model.encoder import Encoder
from bertjax.model.hparams import EncoderConfig
from bertjax.train import build
from conftest import encoder_only, load_config, train_cli

CFG = EncoderConfig(vocab_size=64, hidden_size=32, num_layers=2, num_heads=4, intermediate_size=64,
                    embedding_size=32, attention_dropout=0.0)
# Row 0: one example and padding. Row 1: two packed examples (groups 1 and 2), then padding. 128 positions:
# splash attention's smallest block.
S = 128
IDS = np.zeros((2, S), np.int32)
IDS[0, :90], IDS[1, :120] = np.arange(1, 91) % 60 + 2, np.arange(3, 123) % 60 + 2
GROUPS = np.zeros((2, S), np.int32)
GROUPS[0, :90], GROUPS[1, :50], GROUPS[1, 50:120] = 1, 1, 2


@pytest.fixture(scope="module")
def params():
  return encoder_only(CFG).init(jax.random.key(0), IDS, GROUPS)


@pytest.fixture
def splash_interpreted(monkeypatch):
  """Splash attention in Pallas' interpreter: the TPU kernel's own code, run on the CPU."""
  monkeypatch.setattr(attention_lib, "fused", functools.partial(attention_lib.fused, interpret=True))


def _outputs_and_grads(impl, params):
  """Hidden states and the gradient of a loss over real tokens, under implementation `impl`."""
  model = encoder_only(dataclasses.replace(CFG, attention=impl))
  real = jnp.asarray(GROUPS > 0)[..., None]
  loss = lambda p: jnp.sum(jnp.where(real, model.apply(p, IDS, GROUPS), 0.0) ** 2)
  out = model.apply(params, IDS, GROUPS)
  return np.asarray(out), jax.grad(loss)(params)


@pytest.mark.parametrize("impl", ["dot_product", "splash"])
def test_implementations_agree_with_the_xla_path(impl, params, splash_interpreted):
  """Forward at every real token agrees with xla to 1e-5, the parameter gradient to 1e-5 relative (padding
  rows differ by design: under a fused kernel padding attends to padding, and no loss reads them)."""
  ref, ref_grads = _outputs_and_grads("xla", params)
  out, grads = _outputs_and_grads(impl, params)
  real = GROUPS > 0
  np.testing.assert_allclose(out[real], ref[real], atol=1e-5, rtol=1e-5)
  # Gradients as one vector (the key bias's is zero up to rounding, so leaf by leaf compares noise).
  flat = lambda g: np.concatenate([np.ravel(x) for x in jax.tree.leaves(g)])
  a, b = flat(grads), flat(ref_grads)
  assert np.linalg.norm(a - b) <= 1e-5 * np.linalg.norm(b), np.linalg.norm(a - b) / np.linalg.norm(b)


@pytest.mark.parametrize("impl", ["xla", "dot_product", "splash"])
def test_packed_examples_do_not_see_each_other(impl, params, splash_interpreted):
  """Each packed example of row 1 gives the same states as when it is the row's only example (the encoder
  on the same embeddings, the other example turned into padding)."""
  model = encoder_only(dataclasses.replace(CFG, attention=impl))
  p = nn.unbox(params)
  x = Embeddings(CFG).apply({"params": p["params"]["Embeddings_0"]}, IDS, jnp.zeros_like(IDS), True)
  enc = lambda x, g: Encoder(model.cfg).apply({"params": p["params"]["Encoder_0"]}, x, g)
  packed = np.asarray(enc(x, GROUPS))
  alone = np.asarray(enc(x, np.where(GROUPS == 2, 1, 0).astype(np.int32)))  # only the second example, row 1
  np.testing.assert_allclose(packed[1, 50:120], alone[1, 50:120], atol=1e-5)
  first = np.asarray(enc(x, np.where(GROUPS == 1, 1, 0).astype(np.int32)))
  np.testing.assert_allclose(packed[1, :50], first[1, :50], atol=1e-5)


def test_auto_picks_the_platform_kernel_and_falls_back_with_a_notice():
  assert attention_lib.resolve("auto", 0.0, "cpu") == ("xla", "")
  assert attention_lib.resolve("auto", 0.0, "tpu") == ("splash", "")
  assert attention_lib.resolve("auto", 0.0, "gpu", "bfloat16") == ("cudnn", "")
  impl, notice = attention_lib.resolve("auto", 0.1, "gpu", "bfloat16")
  assert impl == "xla" and "attention_dropout=0.1" in notice and "\n" not in notice
  assert attention_lib.resolve("auto", 0.0, "gpu", "float32")[0] == "xla"  # cuDNN has no float32 kernel
  with pytest.raises(UserError, match="runs on TPU only"):
    attention_lib.resolve("splash", 0.0, "cpu")
  assert attention_lib.resolve("cudnn", 0.0, "cpu", strict=False)[0] == "xla"  # loading elsewhere: xla


def test_config_checks_fused_choices():
  c = load_config("configs/bert.py:tiny")
  assert model_config.encoder_config(c.model).attention == "xla"  # auto on this CPU
  for attention, dropout, dtype, fragment in [("cudnn", 0.1, "bfloat16", "attention_dropout=0"),
                                              ("dot_product", 0.1, "float32", "applies no dropout"),
                                              ("cudnn", 0.0, "float32", "--config.model.dtype=bfloat16"),
                                              ("flash", 0.0, "float32", "use one of")]:
    c.model.update(attention=attention, attention_dropout=dropout, dtype=dtype)
    with pytest.raises(UserError, match=fragment.replace(".", r"\.")):
      build.validate(c)


def test_fused_choice_with_attention_dropout_exits_2(tmp_path):
  proc = train_cli(tmp_path / "w", "--config.model.attention=splash")
  lines = [l for l in proc.stderr.splitlines() if l.strip()]
  assert proc.returncode == 2 and len(lines) == 1 and "attention_dropout" in lines[0], proc.stderr[-2000:]
  assert not (tmp_path / "w").exists()


def test_heads_first_dots_equal_the_token_major_einsums():
  """mha's batched dots, run heads-first for XLA:CPU's sake (docs/cpu.md), give the scores, context and gradients
  of the token-major einsums they replaced (fewer queries than keys, as a layer computing only some rows has)."""
  rng = np.random.default_rng(0)
  q, k, v = (jnp.asarray(rng.standard_normal((2, n, 3, 8)), jnp.float32) for n in (5, 7, 7))
  old = lambda q, k, v: jnp.einsum("bhqk,bkhd->bqhd", jax.nn.softmax(
      jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32)), v)
  new = lambda q, k, v: mha.context_of(jax.nn.softmax(mha.scores_of(q, k)), v)
  both = jax.jit(lambda f: jax.value_and_grad(lambda *a: jnp.sum(jnp.sin(f(*a))), argnums=(0, 1, 2))(q, k, v),
                 static_argnums=0)
  np.testing.assert_allclose(jax.jit(new)(q, k, v), jax.jit(old)(q, k, v), rtol=1e-6, atol=1e-6)
  for got, want in zip(jax.tree.leaves(both(new)), jax.tree.leaves(both(old))):
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
  # Heads first: both dots batch over the leading (B, heads) axes of operands laid out [B, heads, S, head_dim].
  dots = [e.params["dimension_numbers"] for e in jax.make_jaxpr(new)(q, k, v).jaxpr.eqns
          if e.primitive.name == "dot_general"]
  assert dots == [(((3,), (3,)), ((0, 1), (0, 1))), (((3,), (2,)), ((0, 1), (0, 1)))], dots
