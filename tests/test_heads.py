"""Head gates, Michel et al.'s importance and iterative pruning (bertjax.compress.prune), on micro classifiers."""

import functools
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.compress import prune as heads
from bertjax.core import sharding as sh
from bertjax.finetune import model as ft_model
from bertjax.finetune.classification import model as cls_model
from bertjax.model import config as model_config
from conftest import load_config, micro


def _classifier(num_heads=4, seed=0):
  run_config = micro("configs/bert.py:tiny", **{"model.num_heads": num_heads, "model.vocab_size": 50})
  cfg = model_config.encoder_config(run_config.model)
  model = cls_model.Classifier(cfg, 2, deterministic=True)
  ids = jnp.zeros((1, 8), jnp.int32)
  params = jax.tree.map(np.array, sh.strip_boxes(
      model.init(jax.random.key(seed), ids, ids, jnp.ones_like(ids))["params"]))
  return run_config, model, params


def _data(n=24, seq=16, seed=0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(6, seq + 1, n)
  groups = (np.arange(seq)[None] < lengths[:, None]).astype(np.int32)
  return dict(input_ids=rng.integers(5, 50, (n, seq)).astype(np.int32) * groups, type_ids=np.zeros((n, seq), np.int32),
              groups=groups, label=rng.integers(0, 2, n).astype(np.int32))


def _outputs(model, params, data, gates=None):
  return np.asarray(model.apply({"params": params}, data["input_ids"], data["type_ids"], data["groups"], gates))


def test_gating_a_head_to_zero_equals_removing_its_weights(tmp_path):
  run_config, model, params = _classifier()
  data = _data()
  gates = np.array([[1, 0, 1, 1], [0, 0, 1, 0]], np.float32)  # layer 0 keeps 3 heads, layer 1 keeps 1
  full = _outputs(model, params, data)
  np.testing.assert_array_equal(_outputs(model, params, data, np.ones_like(gates)), full)  # gates of 1: no change
  gated = _outputs(model, params, data, gates)
  assert np.abs(gated - full).max() > 1e-4  # the gates do something

  config, pruned = heads.prune(run_config, params, gates)
  assert config.model.num_heads == 3 and config.model.head_size == 16  # the most any layer keeps; width kept
  assert pruned["encoder"]["layers"]["attention"]["query"]["kernel"].shape == (2, 64, 3, 16)
  assert pruned["encoder"]["layers"]["attention"]["output"]["kernel"].shape == (2, 3, 16, 64)
  # One head slot fewer in each of 2 layers: q, k, v kernels and biases, and its output-projection rows.
  assert heads.num_params(pruned) == heads.num_params(params) - 2 * (3 * (64 * 16 + 16) + 16 * 64)
  small = cls_model.Classifier(model_config.encoder_config(config.model), 2, deterministic=True)
  np.testing.assert_allclose(_outputs(small, pruned, data), gated, atol=2e-5)

  # Saved and loaded back, the physically smaller model gives the same outputs.
  cls_model.save_model(str(tmp_path / "pruned"), config, small, pruned)
  _, loaded_model, loaded = cls_model.load_model(str(tmp_path / "pruned"))
  assert loaded_model.cfg.num_heads == 3
  np.testing.assert_allclose(_outputs(loaded_model, loaded, data), gated, atol=2e-5)


@functools.lru_cache(maxsize=4)
def _one_example_grad(model):
  """d loss / d gates of one example, written here from the model's outputs (softmax cross-entropy by hand),
  not through bertjax.compress.prune or the fine-tuning loss; jitted once for the [1, seq] shape."""
  def loss(g, params, ids, types, groups, label):
    logits = model.apply({"params": params}, ids[None], types[None], groups[None], g)
    return -jax.nn.log_softmax(logits.astype(jnp.float32))[0, label]

  return jax.jit(jax.grad(loss))


def _reference_importance(model, params, data, gates, normalize=True):
  """Michel et al.'s eq. 3 by a Python loop over single examples: mean over x of |d loss(x) / d gate|, then
  (with `normalize`) each layer divided by its L2 norm; without it, (the mean, the per-example gradients)."""
  grad = _one_example_grad(model)
  g = jnp.asarray(gates, jnp.float32)
  per = np.stack([np.asarray(grad(g, params, data["input_ids"][i], data["type_ids"][i], data["groups"][i],
                                  data["label"][i]), np.float64) for i in range(len(data["label"]))])
  raw = np.abs(per).mean(0)
  return raw / np.linalg.norm(raw, axis=1, keepdims=True) if normalize else (raw, per)


def test_importance_is_the_mean_of_per_example_absolute_gradients():
  _, model, params = _classifier(seed=1)
  params["classifier"]["kernel"] *= 30  # gradients well above float32 noise
  data = _data(n=12)
  ones = np.ones((2, 4), np.float32)
  # batch 8: the second batch is 4 examples and 4 padding rows, which must add nothing
  raw = heads.importance(model, params, data, ones, batch_size=8, normalize=False)
  expected, per = _reference_importance(model, params, data, ones, normalize=False)
  np.testing.assert_allclose(raw, expected, rtol=2e-4, atol=1e-9)
  # The old definition, |gradient of the batch mean|, lets examples of opposite sign cancel: it is lower,
  # by far, for some head, so the test above tells the two apart.
  assert (np.abs(per.mean(0)) < 0.5 * expected).any()
  scores = heads.importance(model, params, data, ones, batch_size=8)
  np.testing.assert_allclose(scores, heads.normalize_by_layer(raw), rtol=1e-12)
  np.testing.assert_allclose(np.linalg.norm(scores, axis=1), 1.0, rtol=1e-6)
  # transformers' global min-max: [0, 1], the same ranking
  unit = heads.min_max(scores)
  assert unit.min() == 0.0 and unit.max() == 1.0
  np.testing.assert_array_equal(np.argsort(unit, axis=None, kind="stable"), np.argsort(scores, axis=None, kind="stable"))
  # A head whose output projection is zero cannot matter: importance 0.
  dead = jax.tree.map(np.copy, params)
  dead["encoder"]["layers"]["attention"]["output"]["kernel"][0, 3] = 0.0
  assert heads.importance(model, dead, data, ones, batch_size=8)[0, 3] == 0.0


def test_prune_curve_follows_the_importance_ranking_at_every_step():
  run_config, model, params = _classifier(seed=2)
  data = _data(n=16)
  dead = jax.tree.map(np.copy, params)
  dead["encoder"]["layers"]["attention"]["output"]["kernel"][1, 1] = 0.0  # importance 0: pruned first
  curve = heads.prune_curve(model, dead, data, ["accuracy"], step_fraction=0.25, batch_size=16, log=lambda s: None)
  assert [p["heads_removed"] for p in curve] == [0, 2, 4, 6, 7]
  assert curve[1]["gates"][1][1] == 0.0
  # The whole order, recomputed independently: at each step the heads removed are the lowest-scored of the
  # remaining ones, scored at the current gates (re-scored after every step), across layers.
  for before, after in zip(curve, curve[1:]):
    gates = np.asarray(before["gates"], np.float32)
    score = np.where(gates > 0, _reference_importance(model, dead, data, gates), np.inf)
    n = after["heads_removed"] - before["heads_removed"]
    expected = set(np.argsort(score, axis=None)[:n].tolist())
    newly = set(np.flatnonzero((gates > 0) & (np.asarray(after["gates"]) == 0)).tolist())
    assert newly == expected, (after["heads_removed"], sorted(newly), sorted(expected), score)
  # Each step's metric is that of the model with those heads gated off, and physically removing them gives
  # the same outputs as gating them: removing heads that matter changes the outputs, exactly as gating does.
  full = _outputs(model, dead, data)
  for point in curve[1:]:
    gated = _outputs(model, dead, data, np.asarray(point["gates"], np.float32))
    assert point["accuracy"] == pytest.approx(float((gated.argmax(-1) == data["label"]).mean()))
    assert np.abs(gated - full).max() > 1e-4  # beyond the dead head, live heads are gone, and it shows
  gates = np.asarray(curve[2]["gates"], np.float32)  # 4 of 8 removed (one compile of the smaller model)
  config, pruned = heads.prune(run_config, dead, gates)
  small = cls_model.Classifier(model_config.encoder_config(config.model), 2, deterministic=True)
  np.testing.assert_allclose(_outputs(small, pruned, data), _outputs(model, dead, data, gates), atol=2e-5)


@pytest.fixture(scope="module")
def finetuned(tmp_path_factory):
  """A fine-tuning workdir as `python -m bertjax.finetune ... --config.save_model=True` leaves it (config.json,
  seed_0/model), its model a random-init 4-head classifier: the commands do not care how well it learned,
  and test_finetune checks that fine-tuning writes this layout."""
  from bertjax.data.tokenizer_spec import load_tokenizer
  from bertjax.hf import convert
  from test_finetune import _pair_task

  tmp = tmp_path_factory.mktemp("heads")
  task_dir, ckpt = tmp / "task", str(tmp / "hf")
  task_dir.mkdir()
  vocab = _pair_task(str(task_dir), n_train=16, n_eval=96)
  (tmp / "vocab.txt").write_text("\n".join(vocab) + "\n")
  pre = micro("configs/bert.py:tiny", **{"model.num_heads": 4, "model.vocab_size": len(vocab)})
  convert.write_hf(pre, convert.init_params(pre, seed=0), ckpt, load_tokenizer(f"wordpiece:{tmp / 'vocab.txt'}"))
  config = load_config("configs/finetune.py:tiny")
  config.task.name, config.task.text_a, config.task.text_b = "pairs", "sentence1", "sentence2"
  config.task.source, config.init.checkpoint = f"tsv:{task_dir}", ckpt
  config.seq_len, config.save_model, config.eval_batch_size = 32, True, 32
  workdir = tmp / "ft"
  workdir.mkdir()
  (workdir / "config.json").write_text(config.to_json())
  model = cls_model.Classifier(model_config.encoder_config(pre.model), 2, deterministic=True)
  ids = jnp.zeros((1, 8), jnp.int32)
  params = sh.strip_boxes(model.init(jax.random.key(0), ids, ids, jnp.ones_like(ids))["params"])
  cls_model.save_model(str(workdir / "seed_0" / ft_model.MODEL_DIR), pre, model, params)
  return str(workdir)


def test_heads_commands_write_importance_and_the_pruning_curve(finetuned, tmp_path, capsys):
  out = str(tmp_path / "out")
  result = heads.run_command("importance", finetuned, out)
  assert np.shape(result["importance"]) == (2, 4) and len(result["ranking"]) == 8
  assert os.path.getsize(os.path.join(out, "importance.png")) > 0
  save = str(tmp_path / "pruned")
  result = heads.run_command("prune", finetuned, out, step_fraction=0.25, save_dir=save, save_at=0.5)
  curve = json.load(open(os.path.join(out, "prune_curve.json")))["curve"]
  assert [p["heads_removed"] for p in curve] == [0, 2, 4, 6, 7]
  assert os.path.getsize(os.path.join(out, "prune_curve.png")) > 0
  saved = result["saved"]
  assert saved["heads_removed"] == 4 and saved["params_after"] < saved["params_before"]
  assert "saved the model with 4 heads removed" in capsys.readouterr().out
  # The saved model loads, is smaller, and scores what the gated model scored at that step.
  ft = heads.load_finetuned(finetuned, model_dir=save)
  assert ft["model"].cfg.num_heads == saved["stored_heads_per_layer"] < 4
  ones = np.ones((2, ft["model"].cfg.num_heads), np.float32)
  assert heads.evaluate(ft["model"], ft["params"], ft["eval"], ones, ["accuracy"]) == {"accuracy": curve[2]["accuracy"]}
  with pytest.raises(heads.UserError, match="already holds a model"):
    heads.run_command("prune", finetuned, out, save_dir=save)


def test_a_fine_tuned_classifier_exports_with_its_checkpoint_s_tokenizer(finetuned, tmp_path):
  """`python -m bertjax.finetune.predict --model=W/seed_0/model --export=DIR`'s calls: the saved classifier reads
  back as a task model whose tokenizer is the one fine-tuning started from, and exports with it."""
  from bertjax.finetune import task_models

  tm = task_models.load(os.path.join(finetuned, "seed_0", ft_model.MODEL_DIR))
  assert tm.kind == "classification" and tm.model.head == "pooler" and tm.tokenizer is not None
  out = task_models.write_hf(tm, str(tmp_path / "hf"))
  assert json.load(open(os.path.join(out, "config.json")))["architectures"] == ["BertForSequenceClassification"]
  assert os.path.isfile(os.path.join(out, "vocab.txt"))
