"""Sharding: mesh shapes, and the same training on 8 simulated CPU devices as on one (fsdp x tensor and the
CLI under fsdp here; every preset and model family with `pytest -m slow`)."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bertjax.core import sharding
from bertjax.core.errors import UserError
from conftest import REPO, devices, read_metrics, train_cli

EIGHT = devices(8)


def test_mesh_shapes_of_the_presets():
  assert sharding.mesh_shape("dp", 8) == {"data": 8, "fsdp": 1, "tensor": 1}
  assert sharding.mesh_shape("fsdp", 8) == {"data": 1, "fsdp": 8, "tensor": 1}
  assert sharding.mesh_shape("fsdp_tp", 8) == {"data": 1, "fsdp": 4, "tensor": 2}
  assert sharding.mesh_shape("fsdp", 8, {"data": 2}) == {"data": 2, "fsdp": 4, "tensor": 1}
  with pytest.raises(UserError, match="does not divide"):
    sharding.mesh_shape("fsdp_tp", 3)
  with pytest.raises(UserError, match="unknown sharding preset"):
    sharding.rules_for("zero")


def test_explicit_rules_from_the_config_replace_the_presets():
  from flax import linen as nn
  from jax.sharding import PartitionSpec as P

  from conftest import micro

  config = micro(sharding="dp", sharding_rules="activation_batch=data+fsdp, embed=fsdp, vocab=")
  rules = sharding.config_rules(config)
  assert rules == sharding.PRESETS["fsdp"]["rules"]  # the fsdp preset, written out
  assert nn.logical_to_mesh_axes(("embed", "mlp"), rules) == P("fsdp", None)
  config.sharding_rules = "mlp=tensor"
  assert nn.logical_to_mesh_axes(("embed", "mlp"), sharding.config_rules(config)) == P(None, "tensor")
  config.sharding_rules = ""
  assert sharding.config_rules(config) == sharding.PRESETS["dp"]["rules"]
  for bad in ("embed", "hidden=fsdp", "embed=model"):
    with pytest.raises(UserError, match="fix --config.sharding_rules"):
      sharding.rules_for("dp", bad)


def _equivalence(workdir, which):
  proc = subprocess.run([sys.executable, os.path.join(REPO, "tests", "sharded_equivalence.py"), str(workdir), which],
                        cwd=REPO, env=dict(os.environ, **EIGHT), capture_output=True, text=True, timeout=1800)
  line = [l for l in proc.stdout.splitlines() if l.startswith("RESULTS ")]
  assert proc.returncode == 0 and line, proc.stderr[-3000:]
  results = json.loads(line[0][len("RESULTS "):])
  restore = results.pop("restore")
  assert restore["8 devices"]["preset"] == "dp" and restore["1 device"]["devices"] == [1]
  assert 8 in restore["8 devices"]["devices"]  # the state lies on the 8-device mesh, replicated under dp
  for moved in restore.values():
    assert moved["max_diff"] == 0 and moved["matches_target"], moved
  for name, r in results.items():
    np.testing.assert_allclose(r["losses"], r["ref_losses"], rtol=2e-5, err_msg=name)
    assert r["ref_losses"][-1] != r["ref_losses"][0], name  # training moved
    assert r["max_param_diff"] < 1e-5, (name, r["max_param_diff"])
  return results


@pytest.mark.slow  # a long compile or CLI run: the normal tier stays under 8 minutes cold
def test_fsdp_tp_matches_one_device_and_checkpoints_move_between_meshes(tmp_path):
  """BERT trained under fsdp x tensor on 8 devices follows the one-device run; its checkpoint restores under
  dp on 8 devices and on one."""
  assert list(_equivalence(tmp_path, "quick")) == ["bert/fsdp_tp"]


@pytest.mark.slow
def test_every_preset_and_family_matches_one_device(tmp_path):
  # bert x (dp, fsdp, fsdp_tp), albert and electra x (fsdp, fsdp_tp), spanbert + structbert heads x fsdp_tp
  assert len(_equivalence(tmp_path, "all")) == 8


def _train(workdir, *flags, env=None):
  proc = train_cli(workdir, "--config.total_steps=6", "--config.log_every=2", "--config.eval_every=6",
                   "--config.checkpoint_every=6", "--config.model.dropout=0", "--config.model.attention_dropout=0",
                   *flags, env=env)
  assert proc.returncode == 0, proc.stderr[-3000:]
  return read_metrics(workdir)


@pytest.mark.slow  # > 15 s cold: the normal tier stays under 8 minutes (README)
def test_train_cli_fsdp_on_8_devices_matches_one_device(tmp_path):
  one = _train(tmp_path / "one")
  eight = _train(tmp_path / "eight", "--config.sharding=fsdp", env=EIGHT)
  loss = lambda recs: [(r["step"], r["train/loss"]) for r in recs if "train/loss" in r]
  assert [s for s, _ in loss(one)] == [2, 4, 6]
  np.testing.assert_allclose([l for _, l in loss(eight)], [l for _, l in loss(one)], rtol=1e-5)
