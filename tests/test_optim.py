"""bertjax.train.optim: decay mask on real parameter trees, the schedules against the reference formulas,
clipping, and LAMB against a NumPy transcription of google-research/albert's lamb_optimizer.py."""

import functools
import math
import re

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
from flax import linen as nn

from bertjax.core.errors import UserError
from bertjax.model.layer import is_stacked
from bertjax.train import build, optim
from conftest import micro

pytest.importorskip("torch")
import torch_reference as ref  # noqa: E402  (needs torch; tests/torch_reference.py)


def _leaves(tree):
  return {"/".join(k.key for k in path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(tree)}


@pytest.mark.parametrize("spec", ["configs/bert.py:tiny", "configs/albert.py:tiny", "configs/electra.py:tiny"])
def test_decay_mask_excludes_every_bias_and_layernorm_and_nothing_else(spec):
  config = micro(spec, **({"model.num_layers": 4, "model.num_hidden_groups": 2} if "albert" in spec else {}))
  shapes = build.param_shapes(config)
  mask = _leaves(optim.decay_mask(shapes))
  assert len(mask) > 20
  for path, decayed in mask.items():
    *parents, name = path.split("/")
    if name == "bias" or parents[-1] == "ln":
      assert decayed is False, path
    else:
      assert name in ("kernel", "word", "position", "type"), f"unknown kind of parameter {path}"
      assert decayed is True, path


def test_stacked_parameters_are_those_whose_leading_logical_axis_is_layers():
  """optim's per-layer trust ratio finds stacks by path; the model's logical axis names must agree."""
  config = micro("configs/albert.py:tiny", **{"model.num_layers": 4, "model.num_hidden_groups": 2,
                                              "model.sharing": "attention"})
  boxed = jax.eval_shape(functools.partial(build.init_params, build.make_model(config), config), jax.random.key(0))
  is_box = lambda x: isinstance(x, nn.Partitioned)
  first_axis = {"/".join(k.key for k in path): box.names[0]
                for path, box in jax.tree_util.tree_leaves_with_path(boxed, is_leaf=is_box)}
  stacked = _leaves(optim.stacked_mask(build.param_shapes(config)))
  assert first_axis.keys() == stacked.keys()
  assert any(stacked.values()) and not all(stacked.values())
  for path, is_stacked_leaf in stacked.items():
    assert is_stacked_leaf == (first_axis[path] == "layers"), path


def _lr_config(schedule, peak=1e-3, warmup=100, total=1000):
  c = micro()
  c.learning_rate, c.warmup_steps, c.total_steps, c.optimizer.schedule = peak, warmup, total, schedule
  return c


def _pretraining_tx(config):
  return optim.make(config.optimizer, optim.lr_schedule(config))


# The reference formulas, transcribed from their sources once (tests/torch_reference.py, also the
# parity tests' schedules), plus cosine (t: 0-based step, w: warmup, T: total).
REFERENCE = dict(ref.SCHEDULES,
                 cosine=lambda t, w, T: t / w if t < w else 0.5 * (1 + math.cos(math.pi * (t - w) / (T - w))))


@pytest.mark.parametrize("kind", sorted(REFERENCE))
def test_schedule_matches_the_reference_formula(kind):
  peak, w, T = 1e-3, 100, 1000
  lr = optim.lr_schedule(_lr_config(kind, peak, w, T))
  for t in (0, w // 2, w, T // 2, T - 1):
    assert float(lr(t)) == pytest.approx(peak * REFERENCE[kind](t, w, T), rel=1e-5, abs=peak * 1e-6), t


@pytest.mark.parametrize("kind", ["linear", "electra"])
def test_the_optimizer_steps_with_the_schedule(kind):
  """A constant gradient makes each bias-corrected AdamW update lr(t) x 1 (no decay, no clipping): the applied
  rates."""
  config = _lr_config(kind, peak=1e-2, warmup=4, total=12)
  config.optimizer.weight_decay, config.optimizer.clip_norm = 0.0, 0.0
  config.optimizer.bias_correction = True
  tx = _pretraining_tx(config)
  params = {"w": jnp.ones(3)}
  state = tx.init(params)
  for t in range(12):
    updates, state = tx.update({"w": jnp.full(3, 0.5)}, state, params)
    assert float(-updates["w"][0]) == pytest.approx(1e-2 * REFERENCE[kind](t, 4, 12), rel=1e-4, abs=1e-9), t


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_gradients_are_clipped_to_global_norm_one(name):
  config = _lr_config("linear")
  config.optimizer.name = name
  tx = _pretraining_tx(config)
  params = {"a": jnp.ones((2, 3)), "b": jnp.ones(4)}
  for scale, expected_norm in ((10.0, 1.0), (0.5, 0.5)):
    grads = {"a": jnp.full((2, 3), 1.0), "b": jnp.full(4, 1.0)}
    grads = jax.tree.map(lambda g: g * scale / math.sqrt(10), grads)  # global norm = scale
    _, state = tx.update(grads, tx.init(params), params)
    mu = optax.tree_utils.tree_get(state, "mu")  # first moment after one step: (1 - b1) x clipped gradient
    assert float(optax.tree.norm(mu)) / (1 - config.optimizer.b1) == pytest.approx(expected_norm, rel=1e-5)


@pytest.mark.parametrize("name", ["adamw", "lamb"])
def test_clip_norm_zero_switches_clipping_off(name):
  """clip_norm 0 (RoBERTa's, fairseq's --clip-norm 0.0) means no clipping: a gradient of norm 1e4 reaches
  the moments whole."""
  config = _lr_config("linear")
  config.optimizer.name, config.optimizer.clip_norm = name, 0.0
  tx = _pretraining_tx(config)
  params = {"a": jnp.ones((2, 3)), "b": jnp.ones(4)}
  grads = jax.tree.map(lambda p: jnp.full_like(p, 1e4 / math.sqrt(10)), params)  # global norm 1e4
  _, state = tx.update(grads, tx.init(params), params)
  mu = optax.tree_utils.tree_get(state, "mu")
  assert float(optax.tree.norm(mu)) / (1 - config.optimizer.b1) == pytest.approx(1e4, rel=1e-5)


# ----------------------------------------------------------------- LAMB against the reference

_EXCLUDE = ["LayerNorm", "layer_norm", "bias"]  # ALBERT run_pretraining's exclude_from_weight_decay


def _tf_name(path: str) -> str:
  """bertjax's LayerNorm scope `ln` (scale, bias) is the TF reference's `LayerNorm` (gamma, beta)."""
  return re.sub(r"(^|/)ln/(scale|bias)$", lambda m: m.group(1) + "LayerNorm/" + {"scale": "gamma", "bias": "beta"}[m.group(2)], path)


def _reference_lamb(params, grads_per_step, lrs, b1, b2, eps, wd, clip):
  """google-research/albert lamb_optimizer.py (and optimization.py's global-norm clipping), in NumPy
  float64, on a flat dict name -> one original tensor."""
  p = {k: v.astype(np.float64) for k, v in params.items()}
  m = {k: np.zeros_like(v) for k, v in p.items()}
  v = {k: np.zeros_like(x) for k, x in p.items()}
  excluded = lambda name: any(re.search(r, name) for r in _EXCLUDE)
  for grads, lr in zip(grads_per_step, lrs):
    norm = math.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads.values()))
    for k in p:
      g = grads[k].astype(np.float64) * clip / max(norm, clip)
      m[k] = b1 * m[k] + (1 - b1) * g
      v[k] = b2 * v[k] + (1 - b2) * g * g
      update = m[k] / (np.sqrt(v[k]) + eps)
      if not excluded(k):
        update = update + wd * p[k]
      ratio = 1.0
      if not excluded(k):
        w_norm, g_norm = np.linalg.norm(p[k]), np.linalg.norm(update)
        ratio = (w_norm / g_norm if g_norm > 0 else 1.0) if w_norm > 0 else 1.0
      p[k] = p[k] - ratio * lr * update
  return p


def _unstack(tree):
  """Flat dict TF-style name -> one original tensor: a stacked leaf gives one entry per layer or group
  (which leaves are stacked is checked against the logical axis names above)."""
  out = {}
  for path, leaf in jax.tree_util.tree_leaves_with_path(tree):
    name = _tf_name("/".join(k.key for k in path))
    if is_stacked(path):
      out.update({f"{name}#{i}": np.asarray(leaf[i]) for i in range(leaf.shape[0])})
    else:
      out[name] = np.asarray(leaf)
  return out


@pytest.mark.parametrize("sharing,layers,groups", [("none", 3, 1), ("all", 4, 2)])
def test_lamb_matches_albert_reference_per_layer(sharing, layers, groups):
  config = micro("configs/albert.py:tiny", **{"model.sharing": sharing, "model.num_layers": layers,
                                              "model.num_hidden_groups": groups, "model.vocab_size": 300})
  config.total_steps, config.warmup_steps, config.learning_rate = 10, 3, 1e-2
  config.optimizer.bias_correction = False  # albert's lamb_optimizer.py (the tiny preset corrects: tiny_on_demo)
  o = config.optimizer
  # BERT-like values: weights ~0.02, LayerNorm scales near 1 and biases near 0 (not exactly: excluding them
  # from adaptation must show).
  init = np.random.default_rng(1)
  params = jax.tree_util.tree_map_with_path(
      lambda p, s: (float(p[-1].key == "scale") + init.normal(0, 0.02, s.shape)).astype(np.float32),
      build.param_shapes(config))
  rng = np.random.default_rng(0)
  grads = [jax.tree.map(lambda x: rng.normal(0, 0.05, x.shape).astype(np.float32), params) for _ in range(10)]
  lrs = [float(optim.lr_schedule(config)(t)) for t in range(10)]

  optimizer = _pretraining_tx(config)
  tx = jax.jit(optimizer.update)
  state, ours = optimizer.init(params), jax.tree.map(jnp.asarray, params)
  for g in grads:
    updates, state = tx(g, state, ours)
    ours = optax.apply_updates(ours, updates)

  ref = _reference_lamb(_unstack(params), [_unstack(g) for g in grads], lrs, o.b1, o.b2, o.eps,
                        o.weight_decay, o.clip_norm)
  mine = _unstack(ours)
  assert mine.keys() == ref.keys()
  for k in ref:
    np.testing.assert_allclose(mine[k], ref[k], atol=1e-5, rtol=0, err_msg=k)
  # optax.lamb (trust ratio on every tensor, whole stacks, Adam bias correction) is not this optimizer.
  plain = optax.chain(optax.clip_by_global_norm(1.0), optax.lamb(optim.lr_schedule(config), o.b1, o.b2, o.eps,
                                                                  weight_decay=o.weight_decay, mask=optim.decay_mask))
  state, theirs, update = plain.init(params), jax.tree.map(jnp.asarray, params), jax.jit(plain.update)
  for g in grads:
    updates, state = update(g, state, theirs)
    theirs = optax.apply_updates(theirs, updates)
  assert max(np.abs(_unstack(theirs)[k] - ref[k]).max() for k in ref) > 1e-3


# ------------------------------------------- optimizer.bias_correction / decay_mask against the references
# Each rule below is transcribed from its source once, in NumPy float64, on a flat dict name -> one original
# tensor (TF-style names, so BERT's exclude_from_weight_decay regexes apply as written); each yields the
# parameters after every step.


def _clip(grads, clip):
  """Global-norm clipping: tf.clip_by_global_norm (BERT, ALBERT), apex's max_grad_norm and fairseq's
  clip_grad_norm_ all scale every gradient by clip / max(norm, clip) (torch adds 1e-6 to the norm)."""
  norm = math.sqrt(sum(float((g.astype(np.float64) ** 2).sum()) for g in grads.values()))
  return {k: g.astype(np.float64) * clip / max(norm, clip) for k, g in grads.items()}


def _reference_bert_adam(params, grads_per_step, lrs, b1, b2, eps, wd, clip):
  """google-research/bert optimization.py AdamWeightDecayOptimizer.apply_gradients: next_m, next_v without
  bias correction, update = next_m / (sqrt(next_v) + eps) (+ wd x param unless the name matches
  exclude_from_weight_decay), param -= lr x update."""
  p = {k: v.astype(np.float64) for k, v in params.items()}
  m, v = ({k: np.zeros_like(x) for k, x in p.items()} for _ in range(2))
  for grads, lr in zip(grads_per_step, lrs):
    for k, g in _clip(grads, clip).items():
      m[k], v[k] = b1 * m[k] + (1 - b1) * g, b2 * v[k] + (1 - b2) * g * g
      update = m[k] / (np.sqrt(v[k]) + eps)
      if not any(re.search(r, k) for r in _EXCLUDE):
        update = update + wd * p[k]
      p[k] = p[k] - lr * update
    yield dict(p)


def _reference_nvidia_lamb(params, grads_per_step, lrs, b1, b2, eps, wd, clip):
  """apex csrc/multi_tensor_lamb.cu (FusedLAMB as NVIDIA's BERT recipe runs it: bias_correction 1,
  grad_averaging 1, adam_w_mode 1, use_nvlamb False, max_grad_norm `clip`), run_pretraining.py's no_decay
  groups (weight decay 0.0): stage 1 update = (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps) + decay x p;
  stage 2 ratio = ||p|| / ||update|| per tensor where decay != 0 and both norms are nonzero, p -= lr x ratio x
  update."""
  p = {k: v.astype(np.float64) for k, v in params.items()}
  m, v = ({k: np.zeros_like(x) for k, x in p.items()} for _ in range(2))
  for t, (grads, lr) in enumerate(zip(grads_per_step, lrs), start=1):
    for k, g in _clip(grads, clip).items():
      decay = 0.0 if any(re.search(r, k) for r in _EXCLUDE) else wd
      m[k], v[k] = b1 * m[k] + (1 - b1) * g, b2 * v[k] + (1 - b2) * g * g
      update = (m[k] / (1 - b1 ** t)) / (np.sqrt(v[k] / (1 - b2 ** t)) + eps) + decay * p[k]
      p_norm, u_norm = np.linalg.norm(p[k]), np.linalg.norm(update)
      ratio = p_norm / u_norm if decay != 0 and p_norm != 0 and u_norm != 0 else 1.0
      p[k] = p[k] - lr * ratio * update
    yield dict(p)


def _reference_fairseq_adam(params, grads_per_step, lrs, b1, b2, eps, wd, clip):
  """facebookresearch/SpanBERT pretraining/fairseq/optim/adam.py (RoBERTa's fairseq has the same rule):
  every parameter in one group, denom = sqrt(exp_avg_sq) + eps, step_size = lr x sqrt(1 - b2^t) / (1 - b1^t),
  p -= wd x lr x p, then p -= step_size x exp_avg / denom."""
  p = {k: v.astype(np.float64) for k, v in params.items()}
  m, v = ({k: np.zeros_like(x) for k, x in p.items()} for _ in range(2))
  for t, (grads, lr) in enumerate(zip(grads_per_step, lrs), start=1):
    for k, g in _clip(grads, clip).items():
      m[k], v[k] = b1 * m[k] + (1 - b1) * g, b2 * v[k] + (1 - b2) * g * g
      step_size = lr * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
      p[k] = p[k] - wd * lr * p[k]
      p[k] = p[k] - step_size * m[k] / (np.sqrt(v[k]) + eps)
    yield dict(p)


def _small_tree():
  """Parameters named as bertjax names them (a scanned stack of 2 layers, LayerNorm, biases, embeddings) with
  BERT-like values, and 8 steps of gradients (one step's norm above the clip)."""
  shapes = {"embeddings": {"word": (7, 4), "ln": {"scale": (4,), "bias": (4,)}},
            "encoder": {"layers": {"dense": {"kernel": (2, 4, 4), "bias": (2, 4)}, "ln": {"scale": (2, 4)}}}}
  rng = np.random.default_rng(3)
  params = jax.tree_util.tree_map_with_path(
      lambda p, s: (float(p[-1].key == "scale") + rng.normal(0, 0.02, s)).astype(np.float32), shapes,
      is_leaf=lambda x: isinstance(x, tuple))
  grads = [jax.tree.map(lambda x: (rng.normal(0, 0.05 if t != 2 else 2.0, x.shape)).astype(np.float32), params)
           for t in range(8)]
  return params, grads


def _run_ours(section, params, grads, lrs):
  """bertjax's optimizer for `section` over the steps: the optimizer section and the parameters after each step."""
  o = ml_collections.ConfigDict(dict(name="adamw", b1=0.9, b2=0.98, eps=1e-6, weight_decay=0.01, clip_norm=1.0,
                                     bias_correction=True, decay_mask="bert"))
  o.update(section)
  tx = optim.make(o, lambda t: jnp.asarray(lrs, jnp.float32)[t])
  state, ours, update = tx.init(params), jax.tree.map(jnp.asarray, params), jax.jit(tx.update)
  out = []
  for g in grads:
    updates, state = update(g, state, ours)
    ours = optax.apply_updates(ours, updates)
    out.append(_unstack(ours))
  return o, out


# rule name: (optimizer section, reference, tolerance). fairseq adds eps to sqrt(v) before the bias correction,
# optax to sqrt(v_hat): the same rule up to eps x (1 / sqrt(1 - b2^t) - 1) in the denominator (docs/recipes.md).
RULES = {
    "bert_adam_weight_decay": (dict(bias_correction=False), _reference_bert_adam, 1e-6),
    "nvidia_lamb": (dict(name="lamb", bias_correction=True), _reference_nvidia_lamb, 1e-6),
    "fairseq_adam": (dict(bias_correction=True, decay_mask="all", eps=1e-8), _reference_fairseq_adam, 2e-6),
}


@pytest.mark.parametrize("rule", sorted(RULES))
def test_bias_correction_and_decay_mask_follow_the_reference_update_rules_step_for_step(rule):
  section, reference, tol = RULES[rule]
  params, grads = _small_tree()
  lrs = [1e-2 * (t + 1) / 8 for t in range(8)]
  o, mine = _run_ours(section, params, grads, lrs)
  refs = list(reference(_unstack(params), [_unstack(g) for g in grads], lrs, o.b1, o.b2, o.eps, o.weight_decay,
                        o.clip_norm))
  assert len(refs) == len(mine) == 8
  for t, (got, want) in enumerate(zip(mine, refs), start=1):
    assert got.keys() == want.keys()
    for k in want:
      np.testing.assert_allclose(got[k], want[k], atol=tol, rtol=0, err_msg=f"{rule} step {t} {k}")
  # The switch is what makes the difference: the other setting leaves the reference by far more.
  flipped = dict(section, decay_mask="bert") if rule == "fairseq_adam" else \
      dict(section, bias_correction=not o.bias_correction)
  _, other = _run_ours(flipped, params, grads, lrs)
  assert max(np.abs(other[-1][k] - refs[-1][k]).max() for k in refs[-1]) > 50 * tol


def test_decay_mask_rejects_unknown_values():
  config = micro()
  config.optimizer.decay_mask = "none"
  with pytest.raises(UserError, match="decay_mask='none'; use bert or all"):
    optim.validate(config)


# --------------------------------------------- the fused update (make's default) against the plain optax chain
# Same arithmetic, op for op, so the same bits at the tests' XLA flags (backend optimization level 0; at the
# default level LLVM may contract a multiply-add into an FMA differently in differently fused loops: docs/cpu.md).
FUSED_CASES = {
    "adamw_corrected_bert": dict(bias_correction=True, decay_mask="bert"),
    "adamw_corrected_all": dict(bias_correction=True, decay_mask="all"),
    "adamw_bert_rule": dict(bias_correction=False, decay_mask="bert"),
    "adamw_bert_rule_all": dict(bias_correction=False, decay_mask="all"),
    "lamb_albert": dict(name="lamb", bias_correction=False),
    "lamb_nvidia": dict(name="lamb", bias_correction=True),
    "adamw_no_clipping": dict(clip_norm=0.0),
    "stableadamw": dict(name="stableadamw", clip_norm=0.0),
}


def _loops(compiled) -> int:
  """Loop fusions in the entry computation of a compiled function (what writes and reads whole arrays)."""
  text = compiled.as_text()
  return text[text.index("\nENTRY"):].count("kind=kLoop")


@pytest.fixture(scope="module")
def fused_runs():
  """Per case: the parameters and optimizer state after each of 8 steps of the fused update (with the norm passed
  in, as the train step does, and without) and of the reference chain, plus loop-fusion counts."""
  params, grads = _small_tree()
  lrs = jnp.asarray([1e-2 * (t + 1) / 8 for t in range(8)], jnp.float32)
  out = {}
  for case, section in FUSED_CASES.items():
    o = ml_collections.ConfigDict(dict(name="adamw", b1=0.9, b2=0.98, eps=1e-6, weight_decay=0.01, clip_norm=1.0,
                                       bias_correction=True, decay_mask="bert"))
    o.update(section)
    fused, ref = optim.make(o, lambda t: lrs[t]), optim.make(o, lambda t: lrs[t], fused=False)

    def step(tx, p, s, g, pass_norm=False):
      extra = {"global_norm": optax.tree.norm(g)} if pass_norm else {}
      u, s = tx.update(g, s, p, **extra)
      return optax.apply_updates(p, u), s

    runs = {"fused": jax.jit(functools.partial(step, fused)), "reference": jax.jit(functools.partial(step, ref))}
    if isinstance(fused, optax.GradientTransformationExtraArgs):
      runs["fused_norm_given"] = jax.jit(functools.partial(step, fused, pass_norm=True))
    result = {"structures": (jax.tree.structure(fused.init(params)), jax.tree.structure(ref.init(params)))}
    for name, run in runs.items():
      p, s, trace = jax.tree.map(jnp.asarray, params), fused.init(params), []
      for g in grads:
        p, s = run(p, s, g)
        trace.append(jax.device_get((p, s)))
      result[name] = trace
    result["loops"] = {name: _loops(runs[name].lower(params, fused.init(params), grads[0]).compile())
                       for name in ("fused", "reference")}
    out[case] = result
  return out


@pytest.mark.parametrize("case", sorted(FUSED_CASES))
def test_fused_update_equals_the_optax_chain_bit_for_bit(fused_runs, case):
  run = fused_runs[case]
  assert run["structures"][0] == run["structures"][1]  # same state tree: checkpoints load either way
  for name in ("fused", "fused_norm_given"):
    if name not in run:
      continue
    for t, (got, want) in enumerate(zip(run[name], run["reference"]), start=1):
      for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(got), jax.tree.leaves(want)):
        np.testing.assert_array_equal(a, b, err_msg=f"{case} {name} step {t} {jax.tree_util.keystr(path)}")
  assert not np.array_equal(jax.tree.leaves(run["reference"][0][0])[0], jax.tree.leaves(run["reference"][-1][0])[0])


def test_fused_update_writes_fewer_intermediates(fused_runs):
  """Loop fusions per leaf that the fused update saves: with clipping, the clipped gradient the reference writes out
  (the fused update clips inside the moments' loops); LAMB's trust ratio also the two copies safe_norm writes per
  adapted tensor; StableAdamW's RMS the bias-corrected v it shares with the update. AdamW without clipping: none."""
  params = _small_tree()[0]
  leaves, adapted = len(jax.tree.leaves(params)), sum(jax.tree.leaves(optim.decay_mask(params)))
  saved = {"adamw_corrected_bert": leaves, "adamw_bert_rule": leaves, "lamb_albert": leaves + 2 * adapted,
           "lamb_nvidia": leaves + 2 * adapted, "stableadamw": leaves, "adamw_no_clipping": 0}
  for case, fewer in saved.items():
    loops = fused_runs[case]["loops"]
    assert loops["fused"] <= loops["reference"] - fewer, (case, loops)
  assert fused_runs["adamw_no_clipping"]["loops"]["fused"] == fused_runs["adamw_no_clipping"]["loops"]["reference"]
