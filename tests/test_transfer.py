"""MobileBERT's progressive knowledge transfer (bertjax.compress.transfer, bertjax.model.transfer,
bertjax.objectives.transfer) against NumPy ports of google-research mobilebert (distill_util.py's schedule,
run_pretraining.py's losses, lamb_optimizer.py's step): gates and learning-rate multipliers at phase boundaries,
each loss term, pre-training distillation's label mixing, the layer-wise LAMB over several steps across a phase
boundary, and one jitted train step per phase on tiny networks (frozen parameters move by exactly zero)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax import objectives as objectives_lib
from bertjax.compress import transfer as transfer_lib
from bertjax.core import sharding
from bertjax.data.tokenizer import SpecialIds
from bertjax.model import transfer as model_transfer
from bertjax.objectives import distill as distill_objectives
from bertjax.train import build
from conftest import load_config


# ------------------------------------------------------------------ NumPy ports of the reference
def ref_piece(step, layer, spp):
  """tf.train.piecewise_constant(step, [l p, (l + 1) p], [0, 1, 0.1]): values[i] while x <= boundaries[i]."""
  start = spp * layer
  return 0.0 if step <= start else (1.0 if step <= start + spp else 0.1)


def ref_background(step, spp):
  """distill_util.get_background_lr: min(polynomial_decay(1, t, p, 0.9, power .5), polynomial_decay(0, t, p, 10))."""
  t = step % spp
  return min((1.0 - 0.9) * (1 - t / spp) ** 0.5 + 0.9, (0.0 - 10.0) * (1 - t / spp) + 10.0)


def ref_lr(step, layer, spp):
  return 3.0 * ref_background(step, spp) * ref_piece(step, layer, spp)


def ref_gate(step, layer, spp):
  return 1.0 if ref_piece(step, layer, spp) > 0.5 else 0.0  # layer_wise_learning_rate(binary=True)


def ref_ln(x):
  mean = x.mean(-1, keepdims=True)
  var = ((x - mean) ** 2).mean(-1, keepdims=True)
  return (x - mean) / np.sqrt(var + 1e-12)


def ref_softmax(x):
  e = np.exp(x - x.max(-1, keepdims=True))
  return e / e.sum(-1, keepdims=True)


def ref_losses(teacher_hiddens, student_hiddens, teacher_att, student_att, gates, per_layer=False):
  """run_pretraining.py's extra_loss1..4 (before the factors): hiddens [L + 1] lists with the embedding output first."""
  n = len(gates)
  fmt = at = beta = gamma = 0.0
  stacked = np.stack(teacher_hiddens)
  for i in range(n):
    t, s = teacher_hiddens[i + 1], student_hiddens[i + 1]
    fmt += gates[i] * np.mean((ref_ln(t) - ref_ln(s)) ** 2)
    th = t if per_layer else stacked  # the reference's teacher_hiddens: every layer broadcast
    tm = th.mean(-1, keepdims=True)
    sm = s.mean(-1, keepdims=True)
    tv = ((th - tm) ** 2).mean(-1, keepdims=True)
    sv = ((s - sm) ** 2).mean(-1, keepdims=True)
    beta += gates[i] * np.mean((tm - sm) ** 2)
    gamma += gates[i] * np.mean(np.abs(tv - sv))
    log_s = np.log(ref_softmax(student_att[i]))
    at += gates[i] * np.mean(np.sum(-ref_softmax(teacher_att[i]) * log_s, -1))
  return dict(transfer_hidden=fmt, transfer_attention=at, transfer_mean=beta, transfer_variance=gamma)


# ------------------------------------------------------------------ schedule
def test_gates_and_multipliers_at_phase_boundaries():
  """The published recipe's 24 phases of 10,000 steps: no layer at step 0, bg = 0 at every phase start, layer 0
  while 0 < t <= 10,000, finished layers at 0.3 bg and later ones at 0 (values by hand where written out)."""
  spp, n = 10_000, 24
  for step in (0, 1, 999, 1_000, 9_999, 10_000, 10_001, 119_999, 239_999, 240_000):
    gates = np.asarray(model_transfer.loss_gates(jnp.int32(step), spp, n))
    lrs = np.asarray(model_transfer.lr_multipliers(jnp.int32(step), spp, n))
    np.testing.assert_array_equal(gates, [ref_gate(step, i, spp) for i in range(n)])
    np.testing.assert_allclose(lrs, [ref_lr(step, i, spp) for i in range(n)], rtol=1e-6, atol=1e-7)
  lr = lambda t: np.asarray(model_transfer.lr_multipliers(jnp.int32(t), spp, n))
  assert not lr(0).any() and not lr(10_000).any() and not lr(240_000).any()  # bg = 0 at phase starts
  np.testing.assert_allclose(lr(1)[:2], [3 * 10 / spp, 0.0], rtol=1e-5)  # the ramp: bg = 10 t / p
  np.testing.assert_allclose(lr(1_000)[0], 3 * (0.9 + 0.1 * 0.9 ** 0.5), rtol=1e-6)  # ramp over: 2.9846
  np.testing.assert_allclose(lr(10_001)[:3], [0.1 * 3 * 10 / spp, 3 * 10 / spp, 0.0], rtol=1e-5)
  np.testing.assert_allclose(lr(239_999)[[0, 22, 23]], [0.2703, 0.2703, 2.703], rtol=1e-4)
  assert np.asarray(model_transfer.loss_gates(jnp.int32(10_000), spp, n))[0] == 1  # t <= boundary: still layer 0


# ------------------------------------------------------------------ losses
@pytest.fixture(scope="module")
def layer_outputs():
  rng = np.random.default_rng(0)
  n, b, s, h, heads = 3, 2, 5, 6, 2
  hid = lambda: [rng.normal(size=(b, s, h)).astype(np.float32) * rng.uniform(0.5, 2) + rng.normal() for _ in range(n + 1)]
  att = lambda: [rng.normal(size=(b, heads, s, s)).astype(np.float32) * 2 for _ in range(n)]
  teacher, student, t_att, s_att = hid(), hid(), att(), att()
  return teacher, student, t_att, s_att


@pytest.mark.parametrize("per_layer", [False, True])
def test_each_transfer_loss_equals_the_reference(layer_outputs, per_layer):
  teacher, student, t_att, s_att = layer_outputs
  gates = np.array([0.0, 1.0, 0.0], np.float32)
  outputs = dict(teacher_layers=jnp.stack(teacher[1:]), teacher_embedding=jnp.asarray(teacher[0]),
                 student_layers=jnp.stack(student[1:]), teacher_scores=jnp.stack(t_att),
                 student_scores=jnp.stack(s_att), transfer_gate=jnp.asarray(gates),
                 all_layer_statistics=not per_layer)
  batch = dict(example_weight=jnp.ones(teacher[0].shape[0]))
  want = ref_losses(teacher, student, t_att, s_att, gates, per_layer)
  n = len(gates)
  factors = dict(transfer_hidden=100.0, transfer_attention=1.0, transfer_mean=5000.0, transfer_variance=5.0)
  weights = {k: f / n for k, f in factors.items()}
  total, metrics = objectives_lib.total_loss(weights, outputs, batch)
  for name in factors:
    np.testing.assert_allclose(metrics[f"{name}_loss"].compute(), want[name], rtol=2e-5, err_msg=name)
    assert want[name] > 0
  np.testing.assert_allclose(total, sum(want[k] * weights[k] for k in factors), rtol=2e-5)
  ungated = ref_losses(teacher, student, t_att, s_att, np.ones(n), per_layer)
  _, metrics = objectives_lib.total_loss(weights, dict(outputs, transfer_gate=jnp.ones(n)), batch)
  np.testing.assert_allclose(metrics["transfer_hidden_loss"].compute(), ungated["transfer_hidden"], rtol=2e-5)


def test_distillation_labels_mix_half_one_hot_half_teacher():
  """mlm 0.5 + distill_ce_masked 0.5 (temperature 1) is the reference's cross-entropy against 0.5 one-hot + 0.5
  softmax(teacher), up to the teacher's entropy (a constant: the same gradient)."""
  rng = np.random.default_rng(1)
  s_logits, t_logits = (rng.normal(size=(2, 4, 7)).astype(np.float32) * 2 for _ in range(2))
  labels = rng.integers(0, 7, (2, 4)).astype(np.int32)
  weights = np.array([[1, 1, 1, 0], [1, 1, 0, 0]], np.float32)
  mixed = 0.5 * np.eye(7)[labels] + 0.5 * ref_softmax(t_logits)
  per = -(mixed * np.log(ref_softmax(s_logits))).sum(-1)
  want = (per * weights).sum() / (weights.sum() + 1e-5)
  outputs = dict(mlm_logits=jnp.asarray(s_logits), kd_masked_student_logits=jnp.asarray(s_logits),
                 kd_masked_teacher_logits=jnp.asarray(t_logits), kd_scale=jnp.float32(1.0))
  batch = dict(mlm_labels=jnp.asarray(labels), mlm_weights=jnp.asarray(weights))
  total, _ = objectives_lib.total_loss({"mlm": 0.5, "distill_ce_masked": 0.5}, outputs, batch)
  p_t = ref_softmax(t_logits)
  entropy = (-(p_t * np.log(p_t)).sum(-1) * weights).sum() / weights.sum()
  np.testing.assert_allclose(float(total) + 0.5 * entropy, want, rtol=1e-5)
  assert distill_objectives.ce_masked.count(batch) == weights.sum()


# ------------------------------------------------------------------ LAMB as the reference
def ref_lamb_step(params, grads, m, v, step, spp, n, lr=2e-3, wd=0.01, b1=0.9, b2=0.999, eps=1e-6, clip=1.0):
  """lamb_optimizer.py's apply_gradients with use_layer_wise_warmup, after optimization.py's global-norm clip.
  Names are flat; `layers/*` hold one variable per layer along axis 0 (bert/encoder/layer_<l>/*)."""
  norm = np.sqrt(sum((g.astype(np.float64) ** 2).sum() for g in grads.values()))
  grads = {k: g * clip / max(norm, clip) for k, g in grads.items()}
  bg = ref_background(step, spp)
  new_p, new_m, new_v = {}, {}, {}
  for name in params:
    per_layer = name.startswith("layers/")
    slices = range(n) if per_layer else [None]
    outs = []
    for i in slices:
      pick = (lambda x: x[i]) if per_layer else (lambda x: x)
      w, g, mm, vv = pick(params[name]), pick(grads[name]), pick(m[name]), pick(v[name])
      layer_lr = 3.0 * bg * ref_piece(step, i, spp) if per_layer else 0.0
      gate = 1.0 if layer_lr > 0 else 0.0
      nm = gate * (b1 * mm + (1 - b1) * g)
      nv = gate * (b2 * vv + (1 - b2) * g * g)
      update = nm / (np.sqrt(nv) + eps)
      excluded = name.endswith(("bias", "scale"))  # LayerNorm / FakeLayerNorm / bias
      if not excluded:
        update = update + gate * wd * w
      ratio = 1.0
      if not excluded:
        wn, un = np.linalg.norm(w), np.linalg.norm(update)
        ratio = wn / un if wn > 0 and un > 0 else 1.0
      outs.append((w - layer_lr * ratio * lr * update, nm, nv))
    stack = (lambda j: np.stack([o[j] for o in outs])) if per_layer else (lambda j: outs[0][j])
    new_p[name], new_m[name], new_v[name] = stack(0), stack(1), stack(2)
  return new_p, new_m, new_v


def _transfer_config(**model):
  c = load_config("configs/mobilebert.py:tiny_transfer")
  c.teacher = "unused"
  for k, v in model.items():
    c.model[k] = v
  return transfer_lib.transfer_config(c)


def test_layerwise_lamb_follows_the_reference_step_by_step():
  """Eight steps over two layers with phases of 3 steps (through both phases and past them): the student's
  parameters follow lamb_optimizer.py to float32 precision; the teacher's and the frozen ones do not move."""
  n, spp = 2, 3
  c = _transfer_config(num_layers=n)
  c.transfer.steps = n * spp
  c = transfer_lib.transfer_config(c)  # again: the steps changed
  tx = transfer_lib.make_tx(c, None)
  rng = np.random.default_rng(2)
  flat = {"layers/dense/kernel": (n, 4, 3), "layers/dense/bias": (n, 3), "layers/ln/scale": (n, 3),
          "embeddings/word": (6, 4), "mlm/bias": (6,)}
  tree = lambda d: {"student": {"encoder": {"layers": {"dense": {"kernel": d["layers/dense/kernel"],
                                                                 "bias": d["layers/dense/bias"]},
                                                       "ln": {"scale": d["layers/ln/scale"]}}},
                                "embeddings": {"word": d["embeddings/word"]}, "mlm": {"bias": d["mlm/bias"]}},
                    "teacher": {"word": d["teacher"]}}
  params = {k: rng.normal(size=s).astype(np.float32) for k, s in flat.items()}
  params_t = rng.normal(size=(3, 2)).astype(np.float32)
  m = {k: np.zeros_like(x) for k, x in params.items()}
  v = {k: np.zeros_like(x) for k, x in params.items()}
  state = tx.init(tree(dict(params, teacher=params_t)))
  ours = tree(dict(params, teacher=params_t))
  update = jax.jit(tx.update)
  for step in range(8):
    grads = {k: rng.normal(size=s).astype(np.float32) * 0.3 for k, s in flat.items()}
    updates, state = update(tree(dict(grads, teacher=np.ones_like(params_t))), state, ours)
    ours = jax.tree.map(lambda p, u: np.asarray(p + u), ours, updates)
    params, m, v = ref_lamb_step(params, grads, m, v, step, spp, n)
    for name in flat:
      got = ours["student"]
      for part in ("encoder/" + name if name.startswith("layers/") else name).split("/"):
        got = got[part]
      np.testing.assert_allclose(got, params[name], rtol=2e-6, atol=2e-7, err_msg=f"{name} at step {step}")
    np.testing.assert_array_equal(ours["teacher"]["word"], params_t)
  assert not np.allclose(params["layers/dense/kernel"], 0)


# ------------------------------------------------------------------ one train step per phase
@pytest.fixture(scope="module")
def transfer_run(tmp_path_factory):
  """A tiny IB-BERT teacher written as a bertjax workdir and the stage-1 steps of a tiny MobileBERT student."""
  from bertjax.hf import convert, workdir as wd

  size = dict(vocab_size=40, hidden_size=32, embedding_size=8, num_heads=4, num_layers=2, max_positions=16)
  teacher = load_config("configs/mobilebert.py:ib_bert_tiny")
  for k, v in dict(size, bottleneck_size=32, intermediate_size=64).items():
    teacher.model[k] = v
  teacher.seq_len, teacher.batch_size = 16, 4
  directory = str(tmp_path_factory.mktemp("teacher"))
  teacher_params = convert.init_params(teacher, seed=0)
  wd.write(directory, teacher, teacher_params, {})
  c = load_config("configs/mobilebert.py:tiny_transfer")
  for k, v in dict(size, bottleneck_size=16, intermediate_size=32).items():
    c.model[k] = v
  c.seq_len, c.batch_size, c.teacher = 16, 4, directory
  c.transfer.steps = 4  # 2 phases of 2 steps
  c = transfer_lib.transfer_config(c)
  steps = build.make_steps(c, sharding.make_mesh("dp", jax.devices()[:1]), SpecialIds(0, 1, 2, 3, 4))
  state = steps.init(jax.random.key(0))
  rng = np.random.default_rng(0)
  spec = build.host_batch_spec(c, c.batch_size)
  batch = {k: np.ones(v.shape, v.dtype) for k, v in spec.items()}
  batch["input_ids"] = rng.integers(5, 40, spec["input_ids"].shape).astype(np.int32)
  batch["groups"][:, 12:] = 0
  results = {}
  for step in range(4):  # no layer yet; layer 0 active; a phase start (bg = 0); layer 1 active, layer 0 finished
    before = jax.device_get(state.params)
    new, metrics = steps.train(state, batch)
    results[step] = (before, jax.device_get(new.params), jax.device_get(metrics), jax.device_get(new.opt_state))
    state = new
  return teacher_params, results


def _changed(before, after):
  return jax.tree.map(lambda a, b: not np.array_equal(a, b), before, after)


def test_a_train_step_moves_only_the_phases_layers(transfer_run):
  teacher_params, results = transfer_run
  layer = lambda p, i: jax.tree.map(lambda x: x[i], p["student"]["encoder"]["layers"])
  for step, (before, after, metrics, _) in results.items():
    assert metrics["skipped"].compute() == 0
    jax.tree.map(np.testing.assert_array_equal, after["teacher"], before["teacher"])
    for part in ("embeddings", "mlm"):  # copied from the teacher and frozen: exactly no update
      jax.tree.map(np.testing.assert_array_equal, after["student"][part], before["student"][part])
    moved = [any(jax.tree.leaves(_changed(layer(before, i), layer(after, i)))) for i in range(2)]
    assert moved == {0: [False, False], 1: [True, False], 2: [False, False], 3: [True, True]}[step], step
  before, after, _, _ = results[1]
  jax.tree.map(np.testing.assert_array_equal, layer(after, 1), layer(before, 1))  # exactly zero, not small
  np.testing.assert_array_equal(before["student"]["embeddings"]["word"], teacher_params["embeddings"]["word"])
  # Everything outside the encoder but the embedding norm (NoNorm here, LayerNorm in the teacher) came from it.
  _, copied = transfer_lib.copy_outside_encoder(before["student"], teacher_params, "nonorm", "post")
  assert "embeddings/word" in copied and "mlm/extra_output" in copied and "embeddings/transformation/kernel" in copied
  assert not any(k.startswith(("encoder", "embeddings/ln")) for k in copied)
  _, copied = transfer_lib.copy_outside_encoder(before["student"], teacher_params, "post", "post")
  assert "embeddings/ln/scale" in copied


def test_only_the_active_layers_losses_count(transfer_run):
  """At step 0 no layer is active (every transfer loss 0); later the loss is the active layer's alone, and the
  later layer's LAMB moments stay 0."""
  _, results = transfer_run
  assert float(results[0][2]["loss"].compute()) == 0.0
  for step in (1, 3):
    m = results[step][2]
    assert m["transfer_hidden_loss"].compute() > 0 and m["transfer_attention_loss"].compute() > 0
  moments = results[1][3].inner_states["train"].inner_state[1][1][0]  # clip, then by_layer's (count, (adam, ...))
  nu = moments.nu["student"]["encoder"]["layers"]["attention"]["query"]["kernel"]
  assert np.abs(nu[0]).sum() > 0 and not np.abs(nu[1]).any()
