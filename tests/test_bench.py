"""The benchmark CLI: one JSON object with every documented key, consistent with the analytic FLOPs."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bertjax.core import config as config_lib
from bertjax.core.errors import UserError
from bertjax.data.tokenizer import SPM_SPECIAL
from bertjax.model import flops
from bertjax.train import bench, build
from conftest import REPO, micro

KEYS = ("tokens_per_sec", "step_seconds", "compile_seconds", "model_flops_per_token", "mfu", "peak_memory_bytes")
# The micro model of conftest.micro, spelled as command-line overrides.
MICRO_FLAGS = ["--config.model.hidden_size=64", "--config.model.num_heads=2", "--config.model.intermediate_size=128",
               "--config.seq_len=64"]


@pytest.mark.slow  # 11-19 s cold: the normal tier keeps under 8 minutes on 2 cores
def test_bench_cli_prints_one_json_object():
  cmd = [sys.executable, "-m", "bertjax.train.bench", "--config=configs/bert.py:tiny", *MICRO_FLAGS,
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


@pytest.mark.slow  # five models compiled at tiny sizes: 112 s on 2 cores under load average 9
def test_variants_benchmark_reports_every_method_at_equal_encoder_parameters(tmp_path):
  """benchmarks/variants.py at a tiny size on Python's docs: one row per method with a finite eval MLM loss and a
  step time, each encoder within a few percent of BERT's parameters (its FFN width chosen to match)."""
  out = tmp_path / "variants.json"
  cmd = [sys.executable, "benchmarks/variants.py", "--corpus=demo", f"--work_dir={tmp_path}", "--layers=2",
         "--hidden=64", "--vocab=500", "--seq_len=32", "--batch_size=2", "--steps=2", "--eval_batches=1",
         f"--json={out}"]
  proc = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True,
                        timeout=900)
  assert proc.returncode == 0, proc.stderr[-2000:]
  rows = json.load(open(out))["rows"]
  assert list(rows) == ["bert", "modernbert", "tree", "complex_order", "lsra"]
  bert = rows["bert"]["encoder_params"]
  for name, r in rows.items():
    assert abs(r["encoder_params"] - bert) / bert < 0.05, (name, r["encoder_params"], bert)
    assert np.isfinite(r["eval_mlm_loss"]) and r["eval_mlm_loss"] > 0 and r["step_seconds"] > 0, (name, r)
  assert "eval MLM loss" in proc.stdout


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


def _vs_pytorch():
  """benchmarks/vs_pytorch.py as a module (it is a script, not a package module)."""
  import importlib.util

  spec_ = importlib.util.spec_from_file_location("vs_pytorch", os.path.join(REPO, "benchmarks", "vs_pytorch.py"))
  vs = importlib.util.module_from_spec(spec_)
  spec_.loader.exec_module(vs)
  return vs


def test_vs_pytorch_equal_work_head_trains_the_same_objective():
  """benchmarks/vs_pytorch.py's PyTorch side decodes only the masked slots (bertjax's work) and still trains
  stock BertForPreTraining's objective: same loss and gradients, fewer FLOPs than HF's every-position head."""
  import torch

  vs = _vs_pytorch()
  config = vs.bert_config("tiny", 4, 64)
  config.model.update(hidden_size=32, num_heads=2, intermediate_size=64, vocab_size=300)
  spec = vs.torch_spec(config)
  spec["bert"].update(hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
  torch.manual_seed(0)
  model, _ = vs.torch_model(spec)
  masked = vs.torch_batch(config, bench.synthetic_batch(config, 4))
  rows = np.arange(4)[:, None]
  used = masked["mlm_labels"] >= 0
  np.testing.assert_array_equal(masked["labels"][rows, masked["mlm_positions"]][used], masked["mlm_labels"][used])
  assert (masked["labels"] >= 0).sum() == used.sum()  # every scored position has a slot
  batch = {k: torch.as_tensor(v) for k, v in masked.items()}
  losses, grads = [], []
  for head in ("all", "masked"):
    model.zero_grad()
    loss = vs.torch_loss(model, batch, head)
    loss.backward()
    losses.append(loss.item())
    grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
  np.testing.assert_allclose(losses[1], losses[0], rtol=1e-5)
  torch.testing.assert_close(grads[1], grads[0], rtol=1e-4, atol=1e-6)
  assert vs.hf_flops_per_token(config) > bench.setup(config).flops_per_token


def test_vs_pytorch_scaling_pins_children_and_divides_all_cores_by_one():
  """`vs_pytorch.py --scaling`: a process started inside `pinned` runs on the given core only (what sizes XLA's and
  PyTorch's thread pools), this process's affinity comes back afterwards, and `thread_scaling` divides each
  framework's all-core step time by its one-core one, per round too."""
  vs = _vs_pytorch()
  before = os.sched_getaffinity(0)
  with vs.pinned({min(before)}):
    child = subprocess.run([sys.executable, "-c", "import os; print(sorted(os.sched_getaffinity(0)))"],
                           capture_output=True, text=True, check=True).stdout
  assert json.loads(child) == [min(before)]
  assert os.sched_getaffinity(0) == before
  side = lambda median, rounds: dict(step_seconds=median, round_seconds=rounds)
  r = {"bertjax": {"default@2": side(1.2, [1.0, 1.4]), "default@1": side(2.0, [2.0, 2.0])},
       "torch": {"eager@1": side(1.0, [1.0, 1.0]), "eager@2": side(0.6, [0.5, 0.7])}}
  s = vs.thread_scaling(r)
  assert s["bertjax"] == dict(scaling=0.6, min=0.5, max=0.7, cores=(1, 2))
  assert s["torch"]["scaling"] == pytest.approx(0.6) and s["torch"]["cores"] == (1, 2)
