"""Step-for-step parity of XLNet pretraining with transformers' XLNetLMHeadModel: the same initial weights
(bertjax's, through the XLNet export), the same batches (bertjax's stream windows, perm_mask and target_mapping
built on device, segment ids 0/1/2), memory carried between steps on both sides (transformers' `mems` with
use_mems=True), dropout off, float32, the same AdamW and schedule. Over 20 steps every step's loss agrees to 1e-3
relative and the final parameters to 1e-3 of each tensor's largest value (tests/test_parity.py's bounds)."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing here may download
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import re

import jax
import numpy as np
import pytest

from bertjax.core import sharding
from bertjax.data import pipeline, plm
from bertjax.data.tokenizer import SPM_SPECIAL
from bertjax.hf import xlnet as hx
from bertjax.train import build, step as step_lib
from conftest import load_config

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import torch_reference as ref  # noqa: E402  (needs torch; tests/torch_reference.py)

STEPS, LOSS_RTOL, PARAM_TOL, FLOOR = 20, 1e-3, 1e-3, 1e-3


def parity_config():
  c = load_config("configs/xlnet.py:tiny")
  c.model.vocab_size, c.model.hidden_size, c.model.num_heads, c.model.intermediate_size = 300, 32, 4, 64
  c.model.dropout = c.model.attention_dropout = 0.0
  c.batch_size, c.seq_len = 4, 32
  c.model.xlnet.mem_len, c.model.xlnet.reuse_len = 24, 16  # the memory fills in two steps, then slides
  c.data.perm_size, c.data.num_predict = 8, 5
  c.total_steps, c.warmup_steps = STEPS, 5
  return c


def no_decay(name: str) -> bool:
  """The reference's exclusion from weight decay (zihangdai/xlnet model_utils.py, AdamWeightDecayOptimizer's
  exclude_from_weight_decay=["LayerNorm", "layer_norm", "bias"], with r_s_bias, r_r_bias and r_w_bias
  force-included: include_in_weight_decay)."""
  return bool(re.search("LayerNorm|layer_norm|bias", name)) and not re.search("r_s_bias|r_r_bias|r_w_bias", name)


def torch_adamw(config, model):
  o = config.optimizer
  groups = [{"params": [p], "weight_decay": 0.0 if no_decay(n) else o.weight_decay}
            for n, p in model.named_parameters()]
  kind = torch.optim.AdamW if o.bias_correction else ref.AdamWeightDecay
  opt = kind(groups, lr=config.learning_rate, betas=(o.b1, o.b2), eps=o.eps)
  factor = ref.SCHEDULES[o.schedule]
  return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda t: factor(t, config.warmup_steps, config.total_steps))


def stream(config, tokens=4 * 400):
  """A token stream of sentences of 3..12 tokens over 20 ids that count up (something to learn in 20 steps)."""
  rng = np.random.default_rng(0)
  ids = (5 + (np.arange(tokens) + rng.integers(0, 2, tokens)) % 20).astype(np.int32)
  lengths = rng.integers(3, 13, tokens)
  parity = np.zeros(tokens, bool)
  at, p = 0, False
  for n in lengths:
    parity[at:at + n], at, p = p, at + n, not p
    if at >= tokens:
      break
  rows = pipeline.ArrayRows(dict(input_ids=ids.reshape(-1, 32), word_start=(ids % 3 != 0).reshape(-1, 32),
                                 sentence_parity=parity.reshape(-1, 32)))
  return plm.Stream(rows, tokens, 32)


def test_training_steps_match_transformers_xlnet_lm_head_model():
  config = parity_config()
  build.validate(config)
  steps = build.make_steps(config, sharding.make_mesh("dp", devices=jax.devices()[:1]), SPM_SPECIAL)
  state = steps.init(jax.random.key(config.seed))
  hf, tensors = hx.export(config, jax.tree.map(np.asarray, state.params), "lm", SPM_SPECIAL)
  model = transformers.XLNetLMHeadModel(transformers.XLNetConfig(**{k: v for k, v in hf.items() if k != "architectures"}))
  missing, unexpected = model.load_state_dict({k: torch.tensor(v) for k, v in tensors.items()}, strict=False)
  assert not unexpected and set(missing) <= {"lm_loss.weight"}  # tied to the word embedding
  model = ref.reference_semantics(model)
  opt, sched = torch_adamw(config, model)
  params = list(model.parameters())
  masked_fn = jax.jit(lambda b, t: step_lib.training_batch(b, t, steps.cfg))
  data, lay = stream(config), plm.layout(config, SPM_SPECIAL)

  ours, theirs, mems = [], [], None
  for t in range(STEPS):
    batch = plm.batch_at(data, t, config.batch_size, config.seed, lay)
    m = jax.tree.map(np.asarray, masked_fn(batch, t))
    labels = np.where(m["plm_weights"] > 0, m["plm_labels"], -100)
    state, metrics = steps.train(state, batch)
    ours.append(metrics["loss"].compute())
    out = model(input_ids=ref.long(m["input_ids"]), token_type_ids=ref.long(m["type_ids"]),
                attention_mask=ref.long(m["groups"]), perm_mask=torch.tensor(m["perm_mask"]),
                target_mapping=torch.tensor(m["target_mapping"]), labels=ref.long(labels), mems=mems, use_mems=True)
    mems = out.mems
    theirs.append(ref.train_step(out.loss, opt, sched, params, config.optimizer.clip_norm))
  np.testing.assert_allclose(ours, theirs, rtol=LOSS_RTOL)
  assert theirs[-1] < theirs[0]  # it trained
  assert mems[0].shape[0] == config.model.xlnet.mem_len  # the memory filled and slid on both sides

  _, final = hx.export(config, jax.tree.map(np.asarray, state.params), "lm", SPM_SPECIAL)
  reference = model.state_dict()
  for key, mine in final.items():
    expected = reference[key].detach().numpy()
    scale = max(np.abs(expected).max(), FLOOR)
    assert np.abs(mine - expected).max() / scale <= PARAM_TOL, key
  # and the memories agree: bertjax's right-aligned slots are transformers' mems, layer by layer
  ours_mem = np.asarray(state.memory["mem"])  # [L, B, M, d]
  theirs_mem = np.stack([x.detach().numpy() for x in mems]).transpose(0, 2, 1, 3)  # [L, M, B, d] -> [L, B, M, d]
  np.testing.assert_allclose(ours_mem, theirs_mem, atol=2e-3 * max(1.0, np.abs(theirs_mem).max()))
