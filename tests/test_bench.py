"""The benchmark CLI: one JSON object with every documented key, consistent with the analytic FLOPs."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bertjax import bench, build, config as config_lib, flops
from bertjax.data.tokenizer import SPM_SPECIAL
from bertjax.errors import UserError
from conftest import REPO, micro

KEYS = ("tokens_per_sec", "step_seconds", "compile_seconds", "model_flops_per_token", "mfu", "peak_memory_bytes")
# The micro model of conftest.micro, spelled as command-line overrides.
MICRO_FLAGS = ["--config.model.hidden_size=64", "--config.model.num_heads=2", "--config.model.intermediate_size=128",
               "--config.seq_len=64"]


def test_bench_cli_prints_one_json_object():
  cmd = [sys.executable, "-m", "bertjax.bench", "--config=configs/bert.py:tiny", *MICRO_FLAGS,
         "--batch_size=4", "--steps=3", "--warmup=1"]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-2000:]
  lines = [line for line in proc.stdout.splitlines() if line.strip()]
  assert len(lines) == 1, proc.stdout
  result = json.loads(lines[0])
  for key in KEYS:
    assert key in result, key
    assert result[key] > 0, (key, result[key])
  assert result["batch_size"] == 4 and result["seq_len"] == 64 and result["steps"] == 3
  assert result["tokens_per_sec"] == pytest.approx(4 * 64 / result["step_seconds"])
  assert result["step_seconds_min"] <= result["step_seconds"] <= result["step_seconds_max"]
  # The FLOPs are summary's analytic count for this model; the CPU peak is a matmul measured in the run.
  config = micro("configs/bert.py:tiny")
  model = build.make_model(config)
  expected = flops.train_flops_per_token(model.cfg, 64, config_lib.max_predictions(config),
                                         model.generator, model.sentence_head)
  assert result["model_flops_per_token"] == pytest.approx(expected)
  assert result["peak_flops_source"] == "measured_matmul_2048"
  assert result["mfu"] == pytest.approx(result["tokens_per_sec"] * expected / result["peak_flops"])


def test_synthetic_batch_is_a_valid_pair_batch():
  config = micro("configs/bert.py:tiny")
  batch = bench.synthetic_batch(config, 8)
  ids, sp = batch["input_ids"], SPM_SPECIAL
  assert ids.shape == (8, 64) and (ids[:, 0] == sp.cls).all() and (ids[:, -1] == sp.sep).all()
  assert ((ids == sp.sep).sum(1) == 2).all(), "one [SEP] after A and one after B"
  assert ids.max() < config.model.vocab_size and not np.isin(ids, [sp.pad, sp.unk, sp.mask]).any()
  first_b = (ids == sp.sep).argmax(1) + 1
  assert (batch["type_ids"].argmax(1) == first_b).all()


def test_bench_rejects_zero_steps():
  with pytest.raises(UserError, match="steps"):
    bench.measure(micro("configs/bert.py:tiny"), steps=0)
