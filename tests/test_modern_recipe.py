"""ModernBERT's training recipe (issue #37): StableAdamW against a NumPy transcription of the reference update
rule, the warmup-stable-decay schedule against its formula, and eval masking at its own rate."""

import math

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from bertjax.core import config as config_lib
from bertjax.core.errors import UserError
from bertjax.objectives import masking
from bertjax.train import build, optim, step as step_lib
from conftest import micro


def _reference_stable_adamw(params, grads_per_step, lr, b1, b2, eps, wd, decayed, stacked):
  """optimi's StableAdamW (`_single_param_stableadamw`, Wortsman et al. 2023 Algorithm 2) for one tensor, in
  NumPy: moments updated with debiased betas beta_hat = (beta^t - beta) / (beta^t - 1) (so they *are* the
  bias-corrected moments), rms = sqrt(mean(g^2 / max(v, eps^2))), lr_t = lr(t) / max(1, rms),
  p *= 1 - lr_t * wd, p -= lr_t * m / (sqrt(v) + eps). A stacked tensor is one tensor per leading slice.
  Returns the final params and the largest rms seen."""
  p = np.array(params, np.float64)
  slices = [p[i] for i in range(p.shape[0])] if stacked else [p]
  m = [np.zeros_like(s) for s in slices]
  v = [np.zeros_like(s) for s in slices]
  top = 0.0
  for t, g_full in enumerate(grads_per_step, start=1):
    g_slices = [g_full[i] for i in range(len(slices))] if stacked else [g_full]
    debias = lambda beta: (beta ** t - beta) / (beta ** t - 1)
    b1h, b2h = debias(b1), debias(b2)
    for i, g in enumerate(g_slices):
      g = np.asarray(g, np.float64)
      m[i] = m[i] + (1 - b1h) * (g - m[i])  # exp_avg.lerp_(grad, 1 - beta1_hat)
      v[i] = b2h * v[i] + (1 - b2h) * g * g
      rms = math.sqrt(np.mean(g * g / np.maximum(v[i], eps * eps)))
      top = max(top, rms)
      lr_t = lr(t - 1) / max(1.0, rms)
      if decayed:
        slices[i] *= 1 - lr_t * wd
      slices[i] -= lr_t * m[i] / (np.sqrt(v[i]) + eps)
  return (np.stack(slices) if stacked else slices[0]), top


def test_stable_adamw_matches_the_reference_update_rule_per_tensor_and_per_layer():
  rng = np.random.default_rng(0)
  params = {"layers": {"kernel": rng.normal(size=(2, 3, 4)).astype(np.float32)},  # a scanned stack of 2 layers
            "head": {"kernel": rng.normal(size=(4, 5)).astype(np.float32), "bias": rng.normal(size=(5,)).astype(np.float32)}}
  # Gradients that grow 30x after two steps: the second moment lags, rms > 1 and the update is clipped; layer 1
  # of the stack spikes while layer 0 does not (one rms per layer, not per stacked leaf).
  scales = [1.0, 1.0, 30.0, 1.0, 1.0]
  grads = []
  for s in scales:
    g = jax.tree.map(lambda x: rng.normal(size=x.shape).astype(np.float32), params)
    g["layers"]["kernel"][1] *= s
    g["head"]["kernel"] *= s
    grads.append(g)
  lr = optim.schedule("wsd", 1e-2, 2, 5, 0.4)
  tx = optim.stable_adamw(lr, 0.9, 0.98, 1e-6, 0.1)
  state, p = tx.init(params), jax.tree.map(jnp.asarray, params)
  update = jax.jit(tx.update)
  for g in grads:
    updates, state = update(g, state, p)
    p = jax.tree.map(jnp.add, p, updates)
  tops = {}
  for path, decayed, stacked in ((("layers", "kernel"), True, True), (("head", "kernel"), True, False),
                                 (("head", "bias"), False, False)):
    get = lambda tree: tree[path[0]][path[1]]
    want, tops[path] = _reference_stable_adamw(get(params), [get(g) for g in grads], lr, 0.9, 0.98, 1e-6, 0.1,
                                               decayed, stacked)
    np.testing.assert_allclose(np.asarray(get(p)), want, rtol=2e-5, atol=1e-6, err_msg="/".join(path))
  # The clipping was exercised (with beta2 0.98, rms is at most ~1.7 at step 3: v holds this step's g^2).
  assert tops[("head", "kernel")] > 1.3 and tops[("layers", "kernel")] > 1.3, tops
  # Without the clipping (plain AdamW with the same moments) the spiked tensor would land elsewhere.
  adamw = optax_adamw_params(params, grads, lr)
  assert not np.allclose(adamw["head"]["kernel"], np.asarray(p["head"]["kernel"]), atol=1e-4)


def optax_adamw_params(params, grads, lr):
  import optax
  tx = optax.adamw(lr, 0.9, 0.98, 1e-6, weight_decay=0.1, mask=optim.decay_mask)
  state, p = tx.init(params), params
  update = jax.jit(tx.update)
  for g in grads:
    updates, state = update(g, state, p)
    p = optax.apply_updates(p, updates)
  return jax.tree.map(np.asarray, p)


def test_stableadamw_is_an_optimizer_name_the_factory_builds():
  config = micro("configs/bert.py:tiny", **{"optimizer.name": "stableadamw", "optimizer.schedule": "wsd",
                                            "optimizer.clip_norm": 0.0})
  build.validate(config)
  params = {"layers": {"kernel": jnp.ones((2, 3, 3))}, "ln": {"scale": jnp.ones(3)}}
  grads = {"layers": {"kernel": jnp.ones((2, 3, 3)).at[1].mul(50.0)}, "ln": {"scale": jnp.ones(3)}}
  tx, want = optim.make(config.optimizer, 1e-3), optim.stable_adamw(1e-3, 0.9, 0.999, 1e-6, 0.01)
  state, want_state = tx.init(params), want.init(params)
  for _ in range(2):  # step 1's rms is 1 whatever the gradient; step 2's differs between the two layers
    updates, state = tx.update(grads, state, params)
    wanted, want_state = want.update(grads, want_state, params)
  jax.tree.map(np.testing.assert_array_equal, updates, wanted)
  with pytest.raises(UserError, match="optimizer.name='adafactor'; use adamw, lamb, stableadamw"):
    optim.validate(micro(**{"optimizer.name": "adafactor"}))


def _wsd_reference(t, peak, w, total, fraction):
  """Hägele et al. 2024's trapezoid with the 1-sqrt cooldown, written from the formula."""
  d = round(fraction * total)
  if t < w:
    return peak * t / w
  if t < total - d:
    return peak
  return peak * (1 - math.sqrt((t - (total - d)) / d))


def test_wsd_schedule_is_warmup_stable_then_one_minus_sqrt_decay():
  peak, w, total, fraction = 8e-4, 100, 1000, 0.2
  config = micro(**{"learning_rate": peak, "warmup_steps": w, "total_steps": total, "optimizer.schedule": "wsd",
                    "optimizer.decay_fraction": fraction})
  lr = optim.lr_schedule(config)
  for t in (0, 50, 100, 500, 799, 800, 850, 900, 999, 1000):
    assert float(lr(t)) == pytest.approx(_wsd_reference(t, peak, w, total, fraction), rel=1e-5, abs=1e-10), t
  assert float(lr(1000)) == pytest.approx(0.0, abs=1e-12)
  with pytest.raises(UserError, match="decay_fraction"):
    optim.validate(micro(**{"optimizer.decay_fraction": 0.0}))


def test_eval_batches_mask_at_eval_mask_prob_with_their_own_budget():
  config = micro(**{"masking.mask_prob": 0.3, "masking.eval_mask_prob": 0.15})
  assert config_lib.max_predictions(config) == math.ceil(64 * 0.3)
  assert config_lib.eval_max_predictions(config) == math.ceil(64 * 0.15)
  special = ml_collections.ConfigDict(dict(never_masked=(0, 1, 2, 3, 4), mask=4))
  cfg = build.step_config(config, special)
  assert cfg.masking.mask_prob == 0.3 and cfg.eval_masking.mask_prob == 0.15
  ids = jnp.tile(jnp.arange(10, 74, dtype=jnp.int32)[None], (4, 1))
  batch = dict(input_ids=ids, word_start=jnp.ones_like(ids, bool), example_weight=jnp.ones(4))
  train = step_lib.training_batch(batch, 0, cfg)
  ev = step_lib.eval_batch(batch, 0, cfg)
  assert train["mlm_weights"].shape[1] == 20 and ev["mlm_weights"].shape[1] == 10
  np.testing.assert_allclose(train["mlm_weights"].sum(1), round(64 * 0.3))
  np.testing.assert_allclose(ev["mlm_weights"].sum(1), round(64 * 0.15))
  # Without the key, eval masks as training does (one masking config).
  assert build.step_config(micro(), special).eval_masking is None
  with pytest.raises(UserError, match="eval_mask_prob"):
    masking.validate(micro(**{"masking.eval_mask_prob": 1.5}))


def test_packed_configs_batches_carry_position_ids_for_aot():
  """aot and bench compile from build.host_batch_spec: a packed config's step must see per-example positions
  (RoPE restarts per example), as the loader's packed rows carry them."""
  packed = build.host_batch_spec(micro("configs/modernbert.py:tiny"), 8)
  assert packed["position_ids"].shape == packed["input_ids"].shape == (8, 64)
  assert "position_ids" not in build.host_batch_spec(micro(), 8)


@pytest.mark.parametrize("spec", [pytest.param("configs/bert.py:tiny", marks=pytest.mark.slow),
                                  "configs/modernbert.py:tiny"])
def test_packed_classification_rows_give_the_unpacked_logits_and_loss(spec):
  """finetune pack_train: examples packed several to a row (groups, restarted positions, a gathered [CLS] each)
  give each example the logits it gets alone in a padded row, and the same mean training loss (learned positions;
  RoPE with a sliding window shorter than the row)."""
  from bertjax.finetune import batches, train as ft
  from bertjax.finetune.classification import model as task_model, task as classification
  from bertjax.model import config as model_config

  cfg = model_config.encoder_config(micro(spec, **{"model.local_window": 8}).model)
  # ModernBERT's own head with mean pooling (ModernBERT-base's config.json): each example's mean, not the row's.
  head = dict(head="modernbert", pooling="mean") if "modernbert" in spec else {}
  model = task_model.Classifier(cfg, 3, deterministic=True, **head)
  rng = np.random.default_rng(0)
  lengths, width = [20, 5, 9, 14, 3, 7], 32
  ids = np.zeros((len(lengths), width), np.int32)
  groups = np.zeros_like(ids)
  for i, n in enumerate(lengths):
    ids[i, :n], groups[i, :n] = rng.integers(5, cfg.vocab_size, n), 1
  batch = dict(input_ids=ids, type_ids=np.zeros_like(ids), groups=groups, label=np.arange(len(lengths)) % 3,
               example_weight=np.ones(len(lengths), np.float32))
  batch["example_weight"][-1] = 0.0  # a padding row of the batch: packed nowhere
  params = model.init(jax.random.key(0), ids[:1], ids[:1], groups[:1])["params"]
  alone = np.asarray(model.apply({"params": params}, ids, batch["type_ids"], groups))
  packed = batches.packed(dict(batch, label=np.arange(len(lengths))), width)  # labels: which example is where
  assert packed["input_ids"].shape[0] < len(lengths) and (packed["groups"] > 0).sum() == sum(lengths[:-1])
  out = np.asarray(model.apply({"params": params}, packed["input_ids"], packed["type_ids"], packed["groups"],
                               position_ids=packed["position_ids"], cls_positions=packed["cls_positions"]))
  used = packed["example_weight"] > 0
  assert sorted(packed["label"][used]) == list(range(len(lengths) - 1))
  np.testing.assert_allclose(out[used], alone[packed["label"][used]], atol=2e-5)
  loss = lambda b: float(ft.batch_loss(params, b, None, model, classification.loss))
  assert loss(batches.packed(batch, width)) == pytest.approx(loss(batch), rel=1e-5)


@pytest.mark.slow
def test_modernbert_tiny_trains_on_packed_rows_and_its_eval_mlm_loss_falls(tmp_path, capsys):
  """`python -m bertjax.train --config=configs/modernbert.py:tiny` at micro size: packed rows (the start-up line
  and metrics.jsonl give the packing efficiency), 30% masking in training, 15% at eval, StableAdamW + wsd; the eval
  MLM loss falls well below ln(vocab)."""
  import json
  import os

  from bertjax.train import loop

  config = micro("configs/modernbert.py:tiny", total_steps=60, eval_every=20, log_every=20, warmup_steps=6)
  loop.train_and_evaluate(config, str(tmp_path))
  records = [json.loads(line) for line in open(os.path.join(tmp_path, "metrics.jsonl"))]
  evals = [r["eval/mlm_loss"] for r in records if "eval/mlm_loss" in r]
  train = [r for r in records if "train/loss" in r]
  assert len(evals) == 3 and evals[-1] < evals[0] < math.log(config.model.vocab_size) - 0.5, evals
  # Blocks end on sentence boundaries (data.instances.single_instances, no text dropped): at micro's 64 positions
  # a row holds one to three of them: about 0.84 real tokens (the tiny preset at 128: 0.867).
  assert all(r["packing_efficiency"] > 0.8 for r in train), [r["packing_efficiency"] for r in train]
  out = capsys.readouterr().out
  assert "packing efficiency" in out and "packed instances" in out


def test_aot_refuses_a_microbatch_the_devices_do_not_divide_in_one_line():
  """ModernBERT-large's batch 4,928 on 16 devices with grad_accum_steps=16 gives microbatches of 308: a one-line
  error naming the microbatch, not a shard_map traceback from inside the compile."""
  from bertjax import aot

  config = micro("configs/modernbert.py:tiny", batch_size=32, grad_accum_steps=4)
  with pytest.raises(UserError, match=r"microbatch 8 of grad_accum_steps=4\) is not divisible by the 16 devices"):
    aot.compile_for(config, aot.parse_topology("v4-32"))


@pytest.mark.slow
def test_finetune_pack_train_learns_the_pair_task_with_more_real_tokens_per_position(tmp_path):
  """--config.pack_train=True end to end: classification batches packed several examples to a row learn the
  generated pair task (tests/test_finetune.py's) as unpacked ones do, and the share of the computed positions that
  are real tokens rises above the length buckets'."""
  import json
  import os

  from bertjax.finetune import train
  from conftest import load_config
  from test_finetune import pair_task_and_checkpoint

  task_dir, ckpt = pair_task_and_checkpoint(tmp_path)
  shares = {}
  for pack in (False, True):
    config = load_config("configs/finetune.py:tiny")
    config.task.name, config.task.text_a, config.task.text_b = "pairs", "sentence1", "sentence2"
    config.task.source, config.init.checkpoint, config.task.metrics = f"tsv:{task_dir}", ckpt, "accuracy"
    config.seeds, config.total_steps, config.seq_len, config.learning_rate = 1, 300, 64, 2e-3
    config.model.dropout = config.model.attention_dropout = 0.0
    config.length_window, config.pack_train = 0, pack
    results = train.finetune(config, str(tmp_path / f"ft-{pack}"))
    assert results["per_seed"][0]["accuracy"] > 0.8, (pack, results["per_seed"])
    shares[pack] = results["timing"][0]["real_token_share"]
    records = [json.loads(line) for line in open(os.path.join(tmp_path, f"ft-{pack}", "seed_0", "metrics.jsonl"))]
    assert all(0 < r["real_token_share"] <= 1 for r in records if "train/loss" in r)
  assert shares[True] > max(0.8, shares[False]), shares
