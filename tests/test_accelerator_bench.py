"""benchmarks/accelerator.py (bertjax vs transformers on one GPU): its synthetic inputs, and the whole command at
tiny sizes on the CPU (--smoke), which must report every case with figures on both sides."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bertjax.core import config as config_lib
from bertjax.model import flops
from bertjax.train import build
from conftest import REPO

sys.path.insert(0, os.path.join(REPO, "benchmarks"))
import accelerator  # noqa: E402


def test_packed_rows_hold_whole_examples_with_their_own_positions():
  config = accelerator.load_config("configs/modernbert.py:tiny", True, 4, 256)
  rows = accelerator.packed_rows(config, np.random.default_rng(0))
  for r in range(4):
    groups, pos, ids = rows["groups"][r], rows["position_ids"][r], rows["input_ids"][r]
    assert (groups > 0).sum() > 256 - 16, "only a tail too short for an example is padding"
    for g in range(1, groups.max() + 1):
      at = np.nonzero(groups == g)[0]
      assert (np.diff(at) == 1).all() and (pos[at] == np.arange(len(at))).all(), "contiguous, positions from 0"
      assert ids[at[0]] == 2 and ids[at[-1]] == 3, "[CLS] ... [SEP]"
  assert rows["input_ids"].max() < config.model.vocab_size


def test_sst2_rows_have_sst2_like_lengths():
  config = accelerator.load_config("configs/bert.py:tiny", True, 32, 128)
  rows = accelerator.sst2_rows(config, 4000, config.model.vocab_size, np.random.default_rng(0))
  lengths = (rows["groups"] > 0).sum(1)
  assert 12.5 < lengths.mean() < 14.5 and lengths.max() <= accelerator.SST2_LENGTHS[2] and lengths.min() >= 3
  assert (rows["input_ids"][np.arange(4000), lengths - 1] == 3).all() and (rows["input_ids"][:, 0] == 2).all()


def test_mlm_loss_reads_only_the_weighted_slots():
  logits = np.log(np.array([[[0.5, 0.5], [0.9, 0.1]]]))
  masked = dict(mlm_labels=np.array([[0, 1]]), mlm_weights=np.array([[1.0, 0.0]]))
  assert accelerator.mlm_loss(logits, masked) == pytest.approx(np.log(2))


@pytest.mark.slow  # every case compiled at tiny sizes on the CPU: ~4 min on 2 busy cores
def test_smoke_reports_every_case_on_both_sides(tmp_path):
  out = tmp_path / "accel.json"
  cmd = [sys.executable, "benchmarks/accelerator.py", "--smoke", "--steps=2", "--warmup=1", f"--out={out}"]
  proc = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True,
                        timeout=1200)
  assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
  result = json.loads(out.read_text())
  rows = {r["case"]: r for r in result["cases"]}
  assert list(rows) == list(accelerator.CASES)
  for name in accelerator.TIMED:
    r = rows[name]
    assert "skipped" not in r, r
    for side in ("bertjax", "torch"):
      assert r[side]["tokens_per_sec"] > 0 and r[side]["mfu"] > 0, (name, side, r[side])
    assert r["ratio"] == pytest.approx(r["bertjax"]["tokens_per_sec"] / r["torch"]["tokens_per_sec"])
    assert name in proc.stdout, "the table has a row per case"
  # MFU counts bertjax's analytic FLOPs: BERT-base's case at smoke size is the tiny BERT at 4 x 64.
  config = accelerator.load_config("configs/bert.py:tiny", True, 4, 64)
  model = build.make_model(config)
  assert rows["bert-base-128"]["flops_per_token"] == pytest.approx(flops.train_flops_per_token(
      model.cfg, 64, config_lib.max_predictions(config), model.generator, model.sentence_head))
  assert 11 < rows["minilm-sst2"]["mean_length"] < 16 and rows["minilm-sst2"]["buckets"][-1] == 64
  check = rows["attention-check"]
  assert check["pair"] == "dot_product vs xla" and check["passed"], check  # cudnn needs a GPU
  assert set(check["models"]) == {"bert-base", "modernbert-base"}
  assert "attention dot_product vs xla bert-base" in proc.stdout and "PASS" in proc.stdout
