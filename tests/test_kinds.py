"""The encoder's parts as registered kinds (bertjax.model.kinds, docs/layout.md): a kind registered from outside
the package trains, is counted by the FLOP counter and checked by config validation; the encoder never tests a
kind's name; unknown kinds are one-line errors; local attention layers count the keys in their window."""

import ast
import dataclasses
import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import linen as nn

from bertjax.core import sharding
from bertjax.core.errors import UserError
from bertjax.data.tokenizer import SPM_SPECIAL
from bertjax.model import config as model_config, flops, kinds
from bertjax.model.ffn import FFNKind
from bertjax.model.layers import dense
from bertjax.train import build
from conftest import micro
from test_step import _batch

PACKAGE = pathlib.Path(__file__).resolve().parent.parent / "bertjax"


# The worked example of docs/layout.md: a toy feed-forward kind (Primer's squared ReLU) registered from a test,
# outside bertjax/. Its parameters live in the FFN block's scope like the built-in kinds'.
@kinds.register("ffn", "toy_relu2")
class SquaredReLU(FFNKind):
  def __call__(self, block, h):
    c = block.cfg
    h = dense(c, c.hidden_size, c.intermediate_size, (sharding.EMBED, sharding.MLP), "intermediate")(h)
    h = jnp.square(nn.relu(h))
    return dense(c, c.intermediate_size, c.hidden_size, (sharding.MLP, sharding.EMBED), "output", out=True)(h)

  def forward_flops(self, c):
    return 2 * 2 * c.hidden_size * c.intermediate_size

  def check(self, m):
    if m.intermediate_size < m.hidden_size:
      raise UserError("model.ffn=toy_relu2 wants model.intermediate_size >= model.hidden_size")


def test_a_kind_registered_outside_the_package_trains_and_is_counted():
  config = micro(batch_size=8, seq_len=32, **{"model.ffn": "toy_relu2", "model.num_layers": 2})
  build.validate(config)
  steps = build.make_steps(config, sharding.make_mesh("dp", devices=jax.devices()[:1]), SPM_SPECIAL)
  state = steps.init(jax.random.key(0))
  ffn = state.params["encoder"]["layers"]["ffn"]
  assert set(ffn) == {"intermediate", "output", "ln"} and ffn["intermediate"]["kernel"].shape == (2, 64, 128)
  before = jax.tree.map(np.asarray, state.params)
  for i in range(2):  # the first step's learning rate is 0 (warmup)
    state, metrics = steps.train(state, _batch(config, i))
    assert np.isfinite(float(metrics["loss"].compute()))
  moved = jax.tree.map(lambda a, b: not np.array_equal(a, np.asarray(b)), before, state.params)
  assert moved["encoder"]["layers"]["ffn"]["intermediate"]["kernel"]
  # The FLOP counter asks the kind: swapping the toy for a kind with other FLOPs changes the count by the difference.
  enc = model_config.encoder_config(config.model)
  geglu = model_config.encoder_config(micro(**{"model.ffn": "geglu", "model.num_layers": 2}).model)
  diff = flops.encoder_forward_flops(geglu, 32) - flops.encoder_forward_flops(enc, 32)
  assert diff == 2 * 64 * 128 * 2  # GeGLU's gate projection (2 x H x I FLOPs) in each of the 2 layers
  config.model.intermediate_size = 32
  with pytest.raises(UserError, match="toy_relu2 wants"):
    build.validate(config)


def test_an_unknown_kind_is_one_line_naming_the_key_and_the_kinds():
  config = micro(**{"model.norm": "sandwich"})
  with pytest.raises(UserError, match=r"model.norm='sandwich' is not a registered norm kind; use one of post, pre"):
    build.validate(config)


def test_the_encoder_and_layer_never_name_a_kind():
  names = {n for family in kinds.KEYS for n in kinds.names(family)}
  for module in ("encoder.py", "layer.py", "embeddings.py"):
    tree = ast.parse((PACKAGE / "model" / module).read_text())
    strings = {n.value for n in ast.walk(tree) if isinstance(n, ast.Constant) and isinstance(n.value, str)}
    assert not strings & names, f"model/{module} names kinds {strings & names}"


def test_local_layers_count_the_keys_in_their_window():
  # ModernBERT-like: 3 layers, layer 0 global, 1 and 2 local with a window of 4 (|q - k| <= 2), 8 positions.
  # Keys per query by position: 3 4 5 5 5 5 4 3 -> mean 34 / 8 = 4.25 (hand count).
  config = micro(**{"model.num_layers": 3, "model.local_window": 4, "model.global_every": 3})
  c = model_config.encoder_config(config.model)
  assert c.local_layers == (False, True, True)
  h, f, s = 64, 128, 8
  per_layer = 2 * 4 * h * h + 2 * 2 * h * f
  hand = 3 * per_layer + 2 * 2 * h * (8 + 4.25 + 4.25)
  assert flops.encoder_forward_flops(c, s) == hand
  every_global = dataclasses.replace(c, local_layers=(), local_window=0)
  assert flops.encoder_forward_flops(every_global, s) == 3 * per_layer + 3 * 2 * 2 * h * 8
