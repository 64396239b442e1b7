"""Ahead-of-time compilation for TPU topologies on this CPU machine (libtpu from the default install)."""

import json
import subprocess
import sys

import pytest

from bertjax import aot
from bertjax.core.errors import UserError
from conftest import MICRO_FLAGS, REPO


def test_topology_names_map_to_chip_grids():
  assert aot.parse_topology("v4-8")["topology"] == "v4:2x2x1"  # 8 cores = 4 megacore chips
  assert aot.parse_topology("v4-32")["chips"] == 16
  assert aot.parse_topology("v5e-16")["topology"] == "v5e:4x4"
  with pytest.raises(UserError, match="unknown topology"):
    aot.parse_topology("tpu-8")


def _aot(*flags):
  cmd = [sys.executable, "-m", "bertjax.aot", "--config=configs/bert.py:tiny", "--topology=v4-8", "--json",
         *[f for f in MICRO_FLAGS if "dupe_factor" not in f and "warmup" not in f], "--config.sharding=fsdp",
         "--config.model.num_layers=5", *flags]
  proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert "could not determine TPU" not in proc.stderr, proc.stderr[-3000:]  # libtpu told the slice
  return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # > 15 s cold: the normal tier stays under 8 minutes (README)
def test_aot_compiles_the_train_step_for_a_v4_slice():
  report = _aot()
  assert report["devices"] == 4 and report["mesh"]["fsdp"] == 4 and report["fits"]
  assert 0 < report["total_gib"] < report["hbm_gib"] == 32
  assert report["xla_estimated_step_seconds"] > 0
  # 5 layers run as a rolled scan, whose body XLA costs once: the cost is extrapolated from depths 1 and 2.
  assert report["xla_cost_of"] == "train step, extrapolated from unrolled depths"
  # Each device's FLOPs are a quarter of the step's (batch-sharded), near the analytic count.
  assert 0.8 < 4 * report["xla_flops_per_device"] / report["model_flops_per_step"] < 2.0


@pytest.mark.slow
def test_the_extrapolated_cost_equals_the_unrolled_steps():
  """The extrapolation from depths 1 and 2 equals XLA's cost of the step compiled with all 5 layers unrolled."""
  report, unrolled = _aot(), _aot("--config.model.scan_unroll=5")
  assert unrolled["xla_cost_of"] == "train step"
  assert report["xla_flops_per_device"] == pytest.approx(unrolled["xla_flops_per_device"], rel=5e-3)
  assert report["xla_estimated_step_seconds"] == pytest.approx(unrolled["xla_estimated_step_seconds"], rel=0.1)


def test_aot_says_plainly_when_a_config_does_not_fit():
  cmd = [sys.executable, "-m", "bertjax.aot", "--config=configs/bert.py:tiny", "--topology=v5e-8",
         "--config.batch_size=65536", "--config.seq_len=512"]
  proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  verdict = proc.stdout.strip().splitlines()[-1]
  assert verdict.startswith("DOES NOT FIT: the TPU compiler needs ") and "has 16 GiB HBM" in verdict, proc.stdout
  needed = float(verdict.split("needs ")[1].split(" GiB")[0])
  assert needed > 16
