"""Fine-tuning step parity with transformers: bertjax's fine-tuning step (model, loss, optimizer as
`python -m bertjax.finetune` builds them) and BertForSequenceClassification (2 and 3 labels, regression)
or ElectraForSequenceClassification (with ELECTRA's layer-wise learning-rate decay) or
RobertaForSequenceClassification (its dense-tanh-out_proj head on <s>, no pooler), from the same weights
on the same batches, dropout off, float32: per-step loss to 1e-3 relative, final parameters to 1e-3. And
dropout on: each dropout knob perturbs BertForSequenceClassification's logits as transformers' does."""

import functools
import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bertjax.data.tokenizer import SPM_SPECIAL
from bertjax.finetune import train as ft
from bertjax.finetune.classification.model import Classifier
from bertjax.finetune.model import init_params
from bertjax.hf import convert, weights as W
from bertjax.model import config as model_config
from bertjax.train import build
from conftest import load_config, micro

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
import torch_reference as ref  # noqa: E402  (needs torch; tests/torch_reference.py)

STEPS, LOSS_RTOL, PARAM_TOL, FLOOR = 20, 1e-3, 1e-3, 1e-3  # FLOOR: see tests/test_parity.py
SPECIAL = SPM_SPECIAL
CASES = {  # name: (pretraining config, outputs, schedule, layer-wise decay)
    "bert-2": ("configs/bert.py:tiny", 2, "linear", 1.0),
    "bert-3": ("configs/bert.py:tiny", 3, "linear_after_warmup", 1.0),
    "bert-regression": ("configs/bert.py:tiny", 1, "linear", 1.0),
    "electra-2-layerwise": ("configs/electra.py:tiny", 2, "electra", 0.8),
    "roberta-2": ("configs/roberta.py:tiny", 2, "linear", 1.0),
}
FAMILY_CLASSES = {"bert": "BertForSequenceClassification", "electra": "ElectraForSequenceClassification",
                  "roberta": "RobertaForSequenceClassification"}
# HF names of the two-layer heads (ELECTRA's and RoBERTa's classifier.dense / classifier.out_proj) in bertjax's tree
TWO_LAYER_HEAD = {"classifier.dense": "transform", "classifier.out_proj": "classifier"}


def electra_layer_rate(name: str, num_layers: int, decay: float) -> float:
  """google-research/electra model/optimization.py _get_layer_lrs on HF names: embeddings (and their
  projection) at depth 0, layer i at i + 1, everything task-specific at L + 2; rate x decay^(L + 2 - depth)."""
  if ".embeddings" in name or "embeddings_project" in name:
    depth = 0
  elif ".encoder.layer." in name:
    depth = int(name.split(".encoder.layer.")[1].split(".")[0]) + 1
  else:
    depth = num_layers + 2
  return decay ** (num_layers + 2 - depth)


def random_params(config, seed=1, std=0.02):
  """Pretrainer parameters as BERT initializes them (`std` normal weights, LayerNorm 1, biases 0), drawn
  with NumPy (no compile)."""
  rng = np.random.default_rng(seed)

  def draw(path, shape):
    name = path[-1].key
    if name in ("scale", "bias"):
      return np.full(shape.shape, float(name == "scale"), np.float32)
    return rng.normal(0, std, shape.shape).astype(np.float32)

  return jax.tree_util.tree_map_with_path(draw, build.param_shapes(config))


def batches(n_outputs, vocab, b=8, s=32, segments=True):
  """[CLS] A [SEP] B [SEP] with padding; two batches in turn, so that 20 steps can fit them. Without
  `segments` (RoBERTa: one token type), every type id is 0."""
  for t in range(STEPS):
    rng = np.random.default_rng(t % 2)
    lengths = rng.integers(s // 2 + 4, s + 1, b)
    ids = rng.integers(5, vocab, (b, s)).astype(np.int32)
    ids[:, 0], ids[:, s // 2] = SPECIAL.cls, SPECIAL.sep
    ids[np.arange(b), lengths - 1] = SPECIAL.sep
    groups = (np.arange(s)[None] < lengths[:, None]).astype(np.int32)
    types = ((np.arange(s)[None] > s // 2) * groups * segments).astype(np.int32)
    label = (ids[:, 1] % n_outputs).astype(np.int32) if n_outputs > 1 else (ids[:, 1] % 5 / 2.0).astype(np.float32)
    yield dict(input_ids=np.where(groups > 0, ids, SPECIAL.pad), type_ids=types, groups=groups, label=label,
               example_weight=np.ones(b, np.float32))


SLOW_CASES = ("roberta-2",)  # the normal tier's time budget: RoBERTa's head is also checked in test_task_models


@pytest.mark.parametrize("case", [pytest.param(c, marks=pytest.mark.slow) if c in SLOW_CASES else c for c in sorted(CASES)])
def test_finetuning_steps_match_transformers(case, tmp_path):
  spec, n_out, schedule, layerwise = CASES[case]
  family = next((f for f in ("electra", "roberta") if f in spec), "bert")
  pre = micro(spec)
  pre.model.vocab_size = 300
  pre.model.dropout = pre.model.attention_dropout = 0.0
  pretrained = random_params(pre)
  dirs = convert.write_hf(pre, pretrained, str(tmp_path / "hf"), special=SPECIAL)

  config = load_config("configs/finetune.py:tiny")
  config.optimizer.schedule, config.optimizer.layerwise_decay = schedule, layerwise
  config.model.classifier_dropout = 0.0
  total, warmup = STEPS, 5
  enc = model_config.encoder_config(pre.model)
  head = family if family in ("electra", "roberta") else "pooler"
  model = Classifier(enc, n_out, 0.0, deterministic=False, head=head)
  pooler = pretrained["sentence"]["pooler"] if family == "bert" else None
  params, fresh = init_params(model, jax.random.key(3), pretrained, pooler)
  assert fresh == (["classifier"] if family == "bert" else ["classifier", "transform"])
  tx = ft.make_tx(config, params, enc, total, warmup)
  step = jax.jit(functools.partial(ft.train_step, model=model, tx=tx))
  initial = jax.tree.map(np.asarray, params)

  cls = getattr(transformers, FAMILY_CLASSES[family])
  hf = cls.from_pretrained(dirs[0], num_labels=n_out, attn_implementation="eager")
  head_map = {"classifier": "classifier"} if family == "bert" else TWO_LAYER_HEAD
  ref.copy_heads(hf, initial, head_map)  # the fresh head: ours, in both
  hf = ref.reference_semantics(hf)
  # The pretraining-shaped keys the reference side reads, over this task's step counts.
  view = ml_collections.ConfigDict(dict(learning_rate=config.learning_rate, warmup_steps=warmup, total_steps=total,
                                        optimizer=config.optimizer.to_dict()))
  scale = (lambda n: electra_layer_rate(n, enc.num_layers, layerwise)) if layerwise < 1 else None
  opt, sched, torch_params = ref.adamw(view, [hf], scale)

  state = tx.init(params)
  ours, theirs = [], []
  for t, batch in enumerate(batches(n_out, pre.model.vocab_size, segments=pre.model.type_vocab_size > 1)):
    params, state, loss = step(params, state, batch, jnp.uint32(0), jnp.int32(t))
    ours.append(float(loss))
    label = torch.tensor(batch["label"]) if n_out == 1 else ref.long(batch["label"])
    out = hf(input_ids=ref.long(batch["input_ids"]), attention_mask=ref.long(batch["groups"]),
             token_type_ids=ref.long(batch["type_ids"]), labels=label)
    theirs.append(ref.train_step(out.loss, opt, sched, torch_params, config.optimizer.clip_norm))
  np.testing.assert_allclose(ours, theirs, rtol=LOSS_RTOL)
  assert np.mean(theirs[-5:]) < np.mean(theirs[:5])  # it learned

  final = jax.tree.map(np.asarray, params)
  prefix = W.PREFIX[family]
  entries = W.entries_of("pooler", prefix + "pooler.dense") if family == "bert" else []
  entries += [e for hf_name, ours_name in head_map.items() for e in W.entries_of(ours_name, hf_name)]
  # The encoder as export writes it (RoBERTa: the position table in HF's padding_idx numbering).
  mine = {**convert.encoder_tensors(pre, final, family, SPECIAL), **W.export_tensors(entries, final)}
  reference = hf.state_dict()
  for key, value in mine.items():
    expected = reference[key].detach().numpy()
    assert np.abs(value - expected).max() / max(np.abs(expected).max(), FLOOR) <= PARAM_TOL, key
  assert len(mine) >= 16 * enc.num_layers


def test_electra_layerwise_rates_follow_the_reference_formula():
  """bertjax's multipliers (on its own tree) equal _get_layer_lrs on the HF names of the same tensors."""
  from bertjax.finetune.model import layer_multipliers

  pre = micro("configs/electra.py:tiny", **{"model.num_layers": 3})
  enc = model_config.encoder_config(pre.model)
  model = Classifier(enc, 2, head="electra")
  params, _ = init_params(model, jax.random.key(0), random_params(pre), None)
  mult = jax.tree.map(np.asarray, layer_multipliers(params, enc, 0.8))
  entries = W.embeddings("electra.") + convert._body("electra", pre, "electra.") + \
      W.entries_of("transform", "classifier.dense") + W.entries_of("classifier", "classifier.out_proj")
  for e in entries:
    m = np.broadcast_to(W.get(mult, e.path), np.shape(W.get(params, e.path)))
    for i, name in enumerate(e.hf):
      got = float(np.ravel(m[i] if e.stacked else m)[0])
      assert got == pytest.approx(electra_layer_rate(name, 3, 0.8), rel=1e-6), name


def test_benchmark_longest_padding_keeps_transformers_logits(monkeypatch):
  """benchmarks/finetune_parity.py --torch_padding=longest cuts each batch to its longest row: the logits of a
  BertForSequenceClassification are those of the rows padded to seq_len, so the option changes the work, not the
  recipe."""
  import importlib.util

  from conftest import REPO

  monkeypatch.syspath_prepend(os.path.join(REPO, "benchmarks"))  # its parity_device, as when run as a script
  spec = importlib.util.spec_from_file_location("finetune_parity", os.path.join(REPO, "benchmarks",
                                                                                 "finetune_parity.py"))
  bench = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(bench)
  torch.manual_seed(0)
  model = transformers.BertForSequenceClassification(transformers.BertConfig(
      vocab_size=50, hidden_size=16, num_hidden_layers=2, num_attention_heads=2, intermediate_size=32,
      num_labels=2)).eval()
  lengths = torch.tensor([5, 9, 3])
  mask = (torch.arange(24)[None] < lengths[:, None]).long()  # right-padded to seq_len 24, the longest row 9
  ids, types, y = torch.randint(1, 50, (3, 24)) * mask, torch.zeros(3, 24, dtype=torch.long), torch.tensor([0, 1, 0])
  trimmed = bench.trim_padding(ids, types, mask, y)
  assert trimmed[0].shape == (3, 9) and trimmed[3] is y
  with torch.no_grad():
    full = model(input_ids=ids, token_type_ids=types, attention_mask=mask).logits
    cut = model(input_ids=trimmed[0], token_type_ids=trimmed[1], attention_mask=trimmed[2]).logits
  np.testing.assert_allclose(cut.numpy(), full.numpy(), atol=1e-6)


DRAWS, MEAN_SQUARE_RTOL, SHIFT_CHI2 = 1000, 0.08, 40.0  # see the test's docstring
SITES = {  # bertjax's knob (the encoder config's or the classifier's) -> transformers' config key
    "model.dropout": "hidden_dropout_prob",
    "model.attention_dropout": "attention_probs_dropout_prob",
    "classifier_dropout": "classifier_dropout",
}


@pytest.mark.parametrize("site", [s if s == "model.dropout" else pytest.param(s, marks=pytest.mark.slow)
                                  for s in sorted(SITES)])  # the normal tier's budget: the three sites of model.dropout
def test_dropout_perturbs_the_logits_as_transformers_does(site, tmp_path):
  """Each dropout knob alone at 0.1 (model.dropout: embeddings, attention output and FFN output;
  model.attention_dropout: the attention probabilities; classifier_dropout: the pooled [CLS]) perturbs a
  BertForSequenceClassification's logits as transformers' does, from the same weights (random, 0.15 normal, so
  that every sublayer moves the residual stream) on DRAWS copies of one batch, each row drawing its own masks:
  - the mean squared change of the logits from the dropout-off logits agrees to MEAN_SQUARE_RTOL (about 4 standard
    errors; without the embeddings', the attention output's or the FFN's dropout it falls 17%, 31% or 45%, and a
    classifier mask shared over the features raises it 25%);
  - the mean logits of each row under dropout agree: the sum over the 16 logits of their squared z-scores is below
    SHIFT_CHI2 (about chi-square with 16 degrees of freedom, 12-20 measured here; masks without the 1/keep scale
    shift the means, and the sum, to several hundred).
  The masks come from the generator model.dropout_rng picks on this platform. With the recipe equal, this is what
  the fine-tuning parity runs (benchmarks/finetune_parity.py) leave to chance: each side's own dropout draws."""
  pre = micro("configs/bert.py:tiny")
  pre.model.vocab_size = 300
  rate = dict.fromkeys(SITES, 0.0) | {site: 0.1}
  pre.model.dropout, pre.model.attention_dropout = rate["model.dropout"], rate["model.attention_dropout"]
  pretrained = random_params(pre, std=0.15)
  dirs = convert.write_hf(pre, pretrained, str(tmp_path / "hf"), special=SPECIAL)
  model = Classifier(model_config.encoder_config(pre.model), 2, rate["classifier_dropout"], deterministic=False)
  params, _ = init_params(model, jax.random.key(3), pretrained, pretrained["sentence"]["pooler"])
  batch = next(batches(2, pre.model.vocab_size))
  inputs = [np.tile(batch[key], (DRAWS, 1)) for key in ("input_ids", "type_ids", "groups")]
  plain = np.asarray(jax.jit(model.clone(deterministic=True).apply)({"params": params}, *inputs))
  ours = np.asarray(jax.jit(lambda p, *x: model.apply({"params": p}, *x, rngs={"dropout": jax.random.key(7)}))(
      params, *inputs))

  hf = transformers.BertForSequenceClassification.from_pretrained(
      dirs[0], num_labels=2, attn_implementation="eager", **{key: rate[knob] for knob, key in SITES.items()})
  ref.set_linear(hf.classifier, params["classifier"])
  hf = ref.reference_semantics(hf, dropout=True)
  kw = dict(input_ids=ref.long(inputs[0]), token_type_ids=ref.long(inputs[1]), attention_mask=ref.long(inputs[2]))
  torch.manual_seed(7)
  with torch.no_grad():
    np.testing.assert_allclose(hf.eval()(**kw).logits.numpy(), plain, atol=1e-5)  # the same network
    theirs = hf.train()(**kw).logits.numpy()

  square = [((x - plain) ** 2).mean() for x in (ours, theirs)]
  assert square[0] == pytest.approx(square[1], rel=MEAN_SQUARE_RTOL)
  a, b = (x.reshape(DRAWS, -1) for x in (ours, theirs))  # [draw, row x logit]
  z = (a.mean(0) - b.mean(0)) / np.sqrt((a.var(0) + b.var(0)) / DRAWS)
  assert (z ** 2).sum() < SHIFT_CHI2, np.round(z, 1)
