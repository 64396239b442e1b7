"""Step-for-step parity with transformers (PyTorch): the same initial weights (bertjax's, through the HF
export), the same masked batches (bertjax's masking; for ELECTRA the same generator samples), dropout
off, float32, and the same optimizer settings from the config. Over 20 steps every step's total loss
agrees to 1e-3 relative and the final parameters to 1e-3 of each tensor's largest value."""

import os

os.environ["HF_HUB_OFFLINE"] = "1"  # nothing here may download
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import math

import jax
import numpy as np
import pytest

from bertjax import loop, sharding, step as step_lib
from bertjax.data.tokenizer import SpecialIds
from bertjax.interop import configs as hf_configs, convert
from conftest import micro

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

STEPS, LOSS_RTOL, PARAM_TOL = 20, 1e-3, 1e-3
# A tensor whose values stay below this is compared in absolute terms (PARAM_TOL x FLOOR): the attention
# key bias has no gradient (softmax is shift-invariant), so both sides hold rounding noise ~1e-9 there.
FLOOR = 1e-3
SPECIAL = SpecialIds(pad=0, unk=1, cls=2, sep=3, mask=4)  # what make_steps masks with by default

FAMILIES = {  # family: (config, overrides, HF class of the (main) network)
    "bert": ("configs/bert.py:tiny", {}, "BertForPreTraining"),
    "roberta": ("configs/roberta.py:tiny", {}, "RobertaForMaskedLM"),
    "albert": ("configs/albert.py:tiny", {"optimizer.name": "adamw"}, "AlbertForPreTraining"),
    "electra": ("configs/electra.py:tiny", {}, "ElectraForPreTraining"),
}

# The schedules as their sources write them (t 0-based, w warmup, T total): see bertjax.optim.
SCHEDULES = {
    "linear": lambda t, w, T: t / w if t < w else 1 - t / T,
    "linear_after_warmup": lambda t, w, T: t / w if t < w else (T - t) / (T - w),
    "electra": lambda t, w, T: (1 - t / T) * min(1.0, t / w),
}


def parity_config(family: str):
  spec, overrides, _ = FAMILIES[family]
  c = micro(spec, **overrides)
  c.model.vocab_size, c.batch_size, c.seq_len = 300, 8, 32
  c.model.dropout = c.model.attention_dropout = 0.0
  c.total_steps, c.warmup_steps = STEPS, 5
  return c


def host_batch(config, step: int) -> dict:
  """A loader-shaped batch: [CLS] A [SEP] B [SEP], random lengths with padding, random sentence labels.
  Tokens count up from a random start, so that MLM has something to learn in 20 steps."""
  rng = np.random.default_rng(step)
  b, s = config.batch_size, config.seq_len
  lengths = rng.integers(s // 2 + 4, s + 1, b)
  n = config.model.vocab_size - 5
  ids = (5 + (rng.integers(0, n, (b, 1)) + np.arange(s)[None]) % n).astype(np.int32)
  ids[:, 0], ids[:, s // 2] = SPECIAL.cls, SPECIAL.sep
  ids[np.arange(b), lengths - 1] = SPECIAL.sep
  groups = (np.arange(s)[None] < lengths[:, None]).astype(np.int32)
  types = (np.arange(s)[None] > s // 2).astype(np.int32) * groups if config.model.type_vocab_size > 1 else 0 * groups
  return dict(input_ids=np.where(groups > 0, ids, SPECIAL.pad), type_ids=types.astype(np.int32),
              word_start=rng.random((b, s)) < 0.7, groups=groups,
              sentence_label=rng.integers(0, 2, b).astype(np.int32), example_weight=np.ones(b, np.float32))


def torch_optimizer(config, modules):
  """transformers' usual AdamW setup (no decay for biases and LayerNorm weights), clipping done by the
  caller, and the config's schedule as a LambdaLR."""
  named = dict(torch.nn.ModuleList(modules).named_parameters())  # shared and tied tensors once
  no_decay = lambda n: n.endswith("bias") or n.endswith(("LayerNorm.weight", "layer_norm.weight"))
  o = config.optimizer
  groups = [{"params": [p for n, p in named.items() if not no_decay(n)], "weight_decay": o.weight_decay},
            {"params": [p for n, p in named.items() if no_decay(n)], "weight_decay": 0.0}]
  opt = torch.optim.AdamW(groups, lr=config.learning_rate, betas=(o.b1, o.b2), eps=o.eps)
  factor = SCHEDULES[o.schedule]
  sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda t: factor(t, config.warmup_steps, config.total_steps))
  return opt, sched, list(named.values())


def torch_inputs(masked) -> dict:
  """HF keyword arguments of a bertjax masked batch: labels -100 except at the (weighted) masked slots."""
  b, s = masked["input_ids"].shape
  labels = np.full((b, s), -100, np.int64)
  rows, slots = np.nonzero(masked["mlm_weights"] > 0)
  labels[rows, masked["mlm_positions"][rows, slots]] = masked["mlm_labels"][rows, slots]
  t = lambda x: torch.tensor(np.asarray(x), dtype=torch.long)
  return dict(input_ids=t(masked["input_ids"]), attention_mask=t(masked["groups"] > 0),
              token_type_ids=t(masked["type_ids"]), labels=t(labels))


def reference_semantics(model):
  """Two HF details that google-research's BERT/ALBERT/ELECTRA (and bertjax) do not have: dropout in
  ALBERT's SOP head (classifier_dropout_prob, beside hidden/attention dropout), and nn.Embedding's
  padding_idx, which keeps the [PAD] row from learning through lookups (ELECTRA's generator can sample
  [PAD] into a real position; the TF references train that row like any other)."""
  for m in model.modules():
    if isinstance(m, torch.nn.Dropout):
      m.p = 0.0
    if isinstance(m, torch.nn.Embedding):
      m.padding_idx = None
  return model.train()


def load_torch(family: str, dirs):
  """The exported network(s) in transformers; ELECTRA's generator takes the discriminator's embeddings
  (bertjax's ELECTRA shares one embedding module, as the paper's)."""
  kw = dict(attn_implementation="eager")
  if family == "electra":
    disc = transformers.ElectraForPreTraining.from_pretrained(dirs[0], **kw)
    gen = transformers.ElectraForMaskedLM.from_pretrained(dirs[1], **kw)
    gen.electra.embeddings = disc.electra.embeddings
    gen.generator_lm_head.weight = disc.electra.embeddings.word_embeddings.weight
    return {"discriminator": reference_semantics(disc), "generator": reference_semantics(gen)}
  model = getattr(transformers, FAMILIES[family][2]).from_pretrained(dirs[0], **kw)
  return {"": reference_semantics(model)}


def torch_loss(family, models, masked, corrupted):
  kw = torch_inputs(masked)
  sentence = torch.tensor(np.asarray(masked["sentence_label"]), dtype=torch.long)
  if family == "bert":
    return models[""](**kw, next_sentence_label=sentence).loss
  if family == "albert":
    return models[""](**kw, sentence_order_label=sentence).loss
  if family == "roberta":
    return models[""](**kw).loss
  generator_loss = models["generator"](**kw).loss
  rtd_labels = torch.tensor(np.asarray(corrupted != masked["original_ids"]), dtype=torch.long)
  disc = models["discriminator"](**dict(kw, input_ids=torch.tensor(np.asarray(corrupted), dtype=torch.long),
                                        labels=rtd_labels))
  return generator_loss + 50.0 * disc.loss  # configs/electra.py: objectives mlm 1, rtd 50


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_training_steps_match_transformers(family, tmp_path):
  config = parity_config(family)
  assert hf_configs.family_for(config) == family
  mesh = sharding.make_mesh("dp", devices=jax.devices()[:1])
  steps = loop.make_steps(config, mesh, SPECIAL)
  state = steps.init(jax.random.key(config.seed))
  dirs = convert.write_hf(config, jax.tree.map(np.asarray, state.params), str(tmp_path / "hf"), special=SPECIAL)
  models = load_torch(family, dirs)
  opt, sched, params = torch_optimizer(config, list(models.values()))
  masked_fn = jax.jit(lambda b, t: step_lib.training_batch(b, t, steps.cfg))
  forward = jax.jit(lambda p, b, t: steps.model.apply({"params": p}, b, rngs=step_lib.model_rngs(config.seed, t)))

  ours, theirs = [], []
  for t in range(STEPS):
    batch = host_batch(config, t)
    masked = jax.tree.map(np.asarray, masked_fn(batch, t))
    corrupted = None
    if family == "electra":  # the generator's samples at the pre-step weights, as the train step draws them
      corrupted = np.asarray(forward(state.params, masked, t)["rtd_input_ids"])
    state, metrics = steps.train(state, batch)
    ours.append(float(metrics["loss"][0]))
    loss = torch_loss(family, models, masked, corrupted)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, config.optimizer.clip_norm)
    opt.step()
    sched.step()
    opt.zero_grad()
    theirs.append(float(loss.detach()))
  np.testing.assert_allclose(ours, theirs, rtol=LOSS_RTOL)
  assert theirs[-1] < theirs[0]  # it trained

  final = jax.tree.map(np.asarray, state.params)
  hf_family = hf_configs.family_for(config)
  compared = 0
  for name, model in models.items():
    _, tensors = convert._network(config, final, hf_family, name == "generator", SPECIAL)
    reference = model.state_dict()
    for key, mine in tensors.items():
      ref = reference[key].detach().numpy()
      scale = max(np.abs(ref).max(), FLOOR)
      assert np.abs(mine - ref).max() / scale <= PARAM_TOL, (name, key)
      compared += 1
  assert compared >= 16 * config.model.num_layers
