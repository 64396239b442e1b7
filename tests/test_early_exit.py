"""Early exit (DeeBERT, PABEE, FastBERT, depth): the spec sheet's worked examples of the exit rules, the
while_loop path against computing every layer, stage freezing, and a fine-tuning run reporting the exits."""

import json
import math
import os
import subprocess
import sys
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.core import sharding as sh
from bertjax.core.errors import UserError
from bertjax.finetune import tasks, train
from bertjax.finetune.classification import early_exit as ee, early_exit_task as eet, exit_rules
from bertjax.model import config as model_config
from conftest import load_config, micro


def test_pabee_worked_example_exits_after_layer_four():
  """Spec: PABEE, t = 2, per-layer argmax [1, 0, 0, 0, ...] exits after layer 4 (counter 0, 0, 1, 2)."""
  labels = [1, 0, 0, 0, 1, 1, 0, 0]
  logits = jnp.asarray(np.eye(2)[labels][None], jnp.float32)  # [1, 8 layers, 2]
  layer, chosen = exit_rules.exit_layers("patience", 2, logits)
  assert layer.tolist() == [4] and chosen.argmax(-1).tolist() == [0]
  assert exit_rules.exit_layers("patience", 3, logits)[0].tolist() == [8]  # 3 agreeing in a row never happens


def test_pabee_loss_weights_sum_to_78_for_12_layers():
  """Spec: the loss weights j for L = 12 sum to 78: a CE at layer j alone weighs j / 78."""
  label = jnp.array([0])
  for j in (1, 5, 12):
    outputs = jnp.zeros((1, 12, 2)).at[0, j - 1].set(jnp.array([0.0, 3.0]))  # CE ln 2 everywhere but layer j
    ce_j = float(jax.nn.logsumexp(jnp.array([0.0, 3.0])))
    want = ((78 - j) * math.log(2) + j * ce_j) / 78
    assert float(eet.pabee_loss(outputs, {"label": label})[0]) == pytest.approx(want, rel=1e-6)


def test_deebert_entropy_threshold_and_fastbert_uncertainty():
  """Spec: entropy of logits [0, 0] = ln 2 = 0.693147, exiting iff S > 0.693147; a uniform p has FastBERT
  uncertainty 1.0."""
  assert float(exit_rules.entropy(jnp.zeros(2))) == pytest.approx(0.693147, abs=1e-6)
  logits = jnp.zeros((1, 3, 2))
  assert exit_rules.exit_layers("entropy", 0.6932, logits)[0].tolist() == [1]
  assert exit_rules.exit_layers("entropy", 0.6931, logits)[0].tolist() == [3]  # none qualifies: the last layer
  assert float(exit_rules.uncertainty(jnp.zeros(5))) == pytest.approx(1.0)
  assert exit_rules.exit_layers("uncertainty", 0.5, jnp.array([[[0.0, 0, 0], [9.0, 0, 0]]]))[0].tolist() == [2]


def test_depth_rule_and_oracle():
  """Depth: exit at the first depth whose cumulative q reaches the threshold; the oracle trades log-likelihood
  against depth_cost per layer."""
  q = jnp.log(jnp.array([[0.1, 0.5, 0.4]]))
  logits = jnp.zeros((1, 3, 2))
  assert exit_rules.exit_layers("depth", 0.5, logits, q)[0].tolist() == [2]
  assert exit_rules.exit_layers("depth", 0.05, logits, q)[0].tolist() == [1]
  per_layer = jnp.array([[[0.0, 0.0], [0.0, 2.0], [0.0, 2.2]]])  # p(y=1) grows with depth
  assert eet.depth_oracle(per_layer, jnp.array([1]), 0.01).tolist() == [2]
  assert eet.depth_oracle(per_layer, jnp.array([1]), 0.5).tolist() == [1]


@pytest.mark.slow  # ~12 s a method on the shared CPU (compiles): the normal tier keeps the rules' unit tests
@pytest.mark.parametrize("method,pooling", [(m, "cls") for m in ee.METHODS] + [("pabee", "mean")])
def test_while_loop_matches_every_layer_and_stops(method, pooling):
  """The lax.while_loop path gives each example the exit layer and logits of computing every layer and applying
  the rule, and computes no layer past the batch's deepest exit."""
  cfg = model_config.encoder_config(micro("configs/bert.py:tiny", **{"model.num_layers": 4}).model)
  model = ee.EarlyExitClassifier(cfg, 2, method, pooling=pooling)
  rng = np.random.RandomState(0)
  ids = jnp.asarray(rng.randint(5, 100, (6, 10)), jnp.int32)
  groups = jnp.ones_like(ids).at[1, 6:].set(0)
  params = sh.strip_boxes(jax.jit(model.init)({"params": jax.random.key(1)}, ids, ids * 0, groups)["params"])
  params["exits"] = jax.tree.map(lambda p: p * 40, params["exits"])  # confident, varied exits
  every = np.asarray(jax.jit(model.apply)({"params": params}, ids, ids * 0, groups))
  rule = exit_rules.RULES[method]
  loop = jax.jit(lambda p, t: ee.exit_loop(model, p, ids, ids * 0, groups, t))
  for t in {"entropy": (0.3, 0.0), "uncertainty": (0.5, 0.0), "patience": (1, 9), "depth": (0.3, 1.01)}[rule]:
    want_layer, want_logits = exit_rules.exit_layers(rule, t, every[..., :2], every[..., 2] if method == "depth"
                                                     else None)
    logits, layer, computed = loop(params, t)
    np.testing.assert_array_equal(np.asarray(layer), want_layer)
    np.testing.assert_allclose(np.asarray(logits), want_logits, rtol=1e-4, atol=1e-4)
    assert int(computed) == want_layer.max()
  assert int(loop(params, {"entropy": 9.0, "uncertainty": 9.0, "patience": 0, "depth": 0.0}[rule])[2]) == 1


def test_mean_pooling_reads_the_real_tokens_only():
  """A pooled head reads [CLS], or with pooling=mean the mean of the real tokens (a sentence-transformers checkpoint's
  [CLS] carries almost nothing below its last layer: the mean is what its intermediate exits can read)."""
  h = jnp.array([[[1.0, 2.0], [3.0, 4.0], [100.0, 100.0]]])  # the third position is padding
  groups = jnp.array([[1, 1, 0]])
  np.testing.assert_allclose(ee.pooled(h, groups, "mean"), [[2.0, 3.0]])
  np.testing.assert_allclose(ee.pooled(h, groups, "cls"), [[1.0, 2.0]])
  np.testing.assert_allclose(ee.pooled(h[:, 0], groups, "cls"), [[1.0, 2.0]])  # only [CLS] kept
  assert ee.EarlyExitClassifier(None, 2, "pabee", pooling="mean").keeps_tokens
  assert not ee.EarlyExitClassifier(None, 2, "deebert").keeps_tokens
  config = load_config("configs/finetune.py:sst2")
  config.task.source, config.early_exit, config.model.pooling = "tsv:/nowhere", "fastbert", "mean"
  with pytest.raises(UserError, match="fastbert"):
    eet.validate(config)


def test_exit_sweep_reports_each_exit_on_its_own(tmp_path):
  """exit_sweep.json's per_layer holds every exit's own metrics: an exit stuck at the majority class shows there,
  while the rule's mixture of exits can hide it."""
  labels = np.array([0, 0, 0, 1])
  outputs = np.zeros((4, 3, 2), np.float32)
  outputs[:, 0, 0] = 5.0  # exit 1: always class 0 (the majority), confident
  outputs[:, 1] = outputs[:, 2] = 5.0 * np.eye(2)[labels]  # exits 2 and 3: right
  data = types.SimpleNamespace(eval={"groups": np.ones((4, 6), np.int32), "label": labels},
                               model={"num_outputs": 2}, extra=dict(hidden=8, intermediate=16, layers=3))
  config = load_config("configs/finetune.py:sst2")
  config.early_exit = "pabee"
  result = eet.evaluate(outputs, data, config, str(tmp_path))
  sweep = json.load(open(tmp_path / "exit_sweep.json"))
  assert [round(m["accuracy"], 4) for m in sweep["per_layer"]] == [0.75, 1.0, 1.0]
  assert result["full_depth_accuracy"] == 1.0 and result["mean_exit_layer"] == 3.0  # patience 3 > 2 agreeing


def test_stage_mask_freezes_what_it_does_not_train():
  """A stage's multipliers: no update at all (nor weight decay) for frozen parameters, and DeeBERT's stage 2
  trains only the exits below the last layer."""
  params = {"encoder": {"w": jnp.ones((3,))}, "exits": {"classifier_kernel": jnp.ones((4, 2, 2))}}
  config = load_config("configs/finetune.py:sst2")
  config.optimizer.weight_decay = 0.1
  stage = tasks.Stage(None, eet._trainable(True))
  tx = train.make_tx(config, params, None, 10, 0, stage)
  grads = jax.tree.map(jnp.ones_like, params)
  updates, _ = tx.update(grads, tx.init(params), params)
  assert float(jnp.abs(updates["encoder"]["w"]).max()) == 0.0
  u = np.asarray(updates["exits"]["classifier_kernel"])
  assert np.all(u[:3] != 0) and np.all(u[3] == 0)


@pytest.mark.slow  # a subprocess: ~30 s
def test_finetune_command_reports_exits(tmp_path):
  """python -m bertjax.finetune ... --config.early_exit=deebert (two stages) writes results.json with accuracy,
  mean exit layer and FLOPs saved, and the threshold sweep."""
  from test_finetune import pair_task_and_checkpoint  # the generated pair task and a tiny HF checkpoint

  task_dir, ckpt = pair_task_and_checkpoint(tmp_path)
  workdir = tmp_path / "ft"
  cmd = [sys.executable, "-m", "bertjax.finetune", "--config=configs/finetune.py:tiny", "--config.early_exit=deebert",
         f"--config.init.checkpoint={ckpt}", f"--config.task.source=tsv:{task_dir}", "--config.task.name=pairs",
         "--config.task.text_a=sentence1", "--config.task.text_b=sentence2", "--config.total_steps=3",
         "--config.seq_len=32", "--config.task.max_train_examples=64", "--config.task.max_eval_examples=64",
         "--config.bucket_lengths=none", f"--workdir={workdir}"]
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=300)
  assert done.returncode == 0, done.stderr[-2000:]
  results = json.load(open(workdir / "results.json"))
  seed = results["per_seed"][0]
  assert {"accuracy", "mean_exit_layer", "flops_saved", "flops_saved_per_example", "full_depth_accuracy"} <= set(seed)
  assert 1 <= seed["mean_exit_layer"] <= results["model"]["layers"] and results["early_exit"] == "deebert"
  sweep = json.load(open(workdir / "seed_0" / "exit_sweep.json"))["sweep"]
  assert sweep[0]["threshold"] == 0.0 and sweep[0]["mean_exit_layer"] == results["model"]["layers"]  # S = 0: none exits
  assert sweep[0]["flops_saved"] < 0  # every head computed, no layer saved
