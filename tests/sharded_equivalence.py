"""Run under XLA_FLAGS=--xla_force_host_platform_device_count=8 by tests/test_sharding.py: a few train
steps per model family on one device and under each sharding preset; prints JSON with the differences."""

import json
import os
import sys

import jax
import numpy as np

sys.path.insert(0, os.path.dirname(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo, if not installed
from conftest import micro  # noqa: E402

from bertjax.core import sharding  # noqa: E402
from bertjax.data.tokenizer import SPM_SPECIAL  # noqa: E402
from bertjax.train import build, loop

STEPS = 3


def _batches(config, n):
  rng = np.random.default_rng(0)
  b, s = config.batch_size, config.seq_len
  out = []
  for _ in range(n):
    ids = rng.integers(5, config.model.vocab_size, (b, s)).astype(np.int32)
    ids[:, 0], ids[:, s // 2], ids[:, -1] = 2, 3, 3
    types = np.zeros((b, s), np.int32)
    types[:, s // 2 + 1:] = 1
    out.append(dict(input_ids=ids, type_ids=types, word_start=rng.random((b, s)) < 0.7,
                    groups=np.ones((b, s), np.int32), sentence_label=rng.integers(0, 2, b).astype(np.int32),
                    example_weight=np.ones(b, np.float32)))
  return out


def run(config, devices, preset):
  config = config.copy_and_resolve_references()
  config.sharding = preset
  mesh = sharding.make_mesh(preset, devices=devices)
  steps = build.make_steps(config, mesh, SPM_SPECIAL, build.placeholder_counts(config))
  state = steps.init(jax.random.key(config.seed))
  losses = []
  for batch in _batches(config, STEPS):
    state, metrics = steps.train(state, loop.global_batch(batch, steps.batch_sharding))
    losses.append(metrics["loss"].compute())
  return losses, state


# Every family under the presets that shard it differently; dp shards nothing but the batch, which every
# preset splits: one family shows it (compiles are the cost).
ALL = {"bert": ("dp", "fsdp", "fsdp_tp"), "albert": ("fsdp", "fsdp_tp"), "electra": ("fsdp", "fsdp_tp"),
       "spanbert_structbert": ("fsdp_tp",)}
# The normal suite's share: BERT under the preset that shards parameters both ways (fsdp x tensor).
QUICK = {"bert": ("fsdp_tp",)}


def family(name):
  if name == "spanbert_structbert":  # SpanBERT's SBO with StructBERT's WSO and SSO: every head the variants add
    return micro("configs/spanbert.py:tiny", **{"objectives.wso": 1.0, "objectives.sso": 1.0})
  return micro(f"configs/{name}.py:tiny")


def main():
  """argv: a workdir for the checkpoint, then `quick` (the normal suite) or `all` (pytest -m slow)."""
  assert jax.device_count() == 8, jax.device_count()
  results = {}
  for name, presets in (ALL if sys.argv[2] == "all" else QUICK).items():
    config = family(name)
    config.model.dropout = config.model.attention_dropout = 0.0
    config.batch_size = 16
    ref_losses, ref_state = run(config, jax.devices()[:1], "dp")
    for preset in presets:
      losses, state = run(config, jax.devices(), preset)
      diff = max(float(np.abs(np.asarray(a) - np.asarray(b)).max())
                 for a, b in zip(jax.tree.leaves(ref_state.params), jax.tree.leaves(state.params)))
      results[f"{name}/{preset}"] = dict(ref_losses=ref_losses, losses=losses, max_param_diff=diff)
      if name == "bert":
        bert, trained = config, (preset, state)
  results["restore"] = restore_elsewhere(bert, *trained, sys.argv[1])
  print("RESULTS " + json.dumps(results))


def restore_elsewhere(config, preset, state, workdir):
  """Saves a state trained under `preset` on 8 devices; restores it under the other sharded preset on 8 and
  under dp on one."""
  from bertjax.train import checkpoint

  ckpt = checkpoint.Checkpointer(workdir)
  ckpt.save(1, state, {"note": "test"}, force=True)
  ckpt.wait()
  saved = jax.tree.map(np.asarray, jax.device_get(state.params))
  out = {}
  elsewhere = "dp" if preset == "fsdp_tp" else "fsdp_tp"
  for name, preset, devices in (("8 devices", elsewhere, jax.devices()), ("1 device", "dp", jax.devices()[:1])):
    c = config.copy_and_resolve_references()
    c.sharding = preset
    target = build.make_steps(c, sharding.make_mesh(preset, devices=devices), SPM_SPECIAL, build.placeholder_counts(c))
    restored = ckpt.restore(target.abstract_state)
    leaves = jax.tree.leaves(restored.params)
    out[name] = dict(
        preset=preset,
        max_diff=max(float(np.abs(np.asarray(a) - b).max()) for a, b in zip(leaves, jax.tree.leaves(saved))),
        devices=sorted({len(x.sharding.device_set) for x in leaves}),
        matches_target=all(x.sharding == s for x, s in zip(leaves, jax.tree.leaves(target.state_shardings.params))))
  ckpt.close()
  return out


if __name__ == "__main__":
  main()
