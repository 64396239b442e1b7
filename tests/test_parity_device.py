"""benchmarks/parity_device.py (--device of the parity benchmarks) without a GPU: cpu changes nothing, gpu stops with
one line naming the side that has no GPU, and with both sides' GPUs faked it sets float32 arithmetic on both."""

import os
import sys
import types

import pytest

torch = pytest.importorskip("torch")
import jax  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks"))
import parity_device  # noqa: E402


@pytest.fixture
def restored(monkeypatch):
  """Whatever setup("gpu") changes is put back: the environment (monkeypatch), JAX's matmul precision, TF32."""
  monkeypatch.setenv("XLA_PYTHON_CLIENT_PREALLOCATE", "")  # records its state, so teardown restores it
  monkeypatch.delenv("XLA_PYTHON_CLIENT_PREALLOCATE")
  precision = jax.config.jax_default_matmul_precision
  tf32 = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
  yield monkeypatch
  jax.config.update("jax_default_matmul_precision", precision)
  torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = tf32


def test_cpu_changes_nothing(restored):
  precision = jax.config.jax_default_matmul_precision
  assert parity_device.setup("cpu") == "cpu"
  assert jax.config.jax_default_matmul_precision == precision
  assert "XLA_PYTHON_CLIENT_PREALLOCATE" not in os.environ


def test_gpu_without_one_is_a_one_line_error(restored):
  with pytest.raises(SystemExit) as e:  # the test session's JAX runs on the CPU
    parity_device.setup("gpu")
  message = str(e.value)
  assert message.startswith("error: --device=gpu but JAX runs on cpu") and "\n" not in message
  restored.setattr(jax, "devices", lambda *a: [types.SimpleNamespace(platform="gpu")])
  restored.setattr(torch.cuda, "is_available", lambda: False)
  with pytest.raises(SystemExit, match="torch.cuda.is_available"):
    parity_device.setup("gpu")


def test_gpu_sets_float32_on_both_sides(restored):
  restored.setattr(jax, "devices", lambda *a: [types.SimpleNamespace(platform="gpu")])
  restored.setattr(torch.cuda, "is_available", lambda: True)
  torch.backends.cuda.matmul.allow_tf32 = True
  assert parity_device.setup("gpu") == "cuda"
  assert jax.config.jax_default_matmul_precision == "highest"
  assert not torch.backends.cuda.matmul.allow_tf32 and not torch.backends.cudnn.allow_tf32
  assert os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] == "false"


def test_bucket_lengths_flag_reaches_the_config():
  import argparse

  import ml_collections

  parser = argparse.ArgumentParser()
  parity_device.add_flag(parser)
  config = ml_collections.ConfigDict({"bucket_lengths": "auto"})
  assert parity_device.configure(config, parser.parse_args([])).bucket_lengths == "auto"
  assert parity_device.configure(config, parser.parse_args(["--bucket_lengths=none"])).bucket_lengths == "none"
  assert parity_device.configure(config, argparse.Namespace()).bucket_lengths == "none"  # a flag it lacks: untouched


def test_a_finished_piece_is_read_back_and_a_changed_recipe_reruns(tmp_path):
  import argparse

  import numpy as np

  calls = []

  def run(value):
    def side():
      calls.append(value)
      return [{"f1": np.float32(value)}, np.float64(1.5), 2]  # numpy among the results, as the metrics have

    return side

  SELECTION = ("json",)  # besides the seeds (parity_device.SEED_FLAGS): a flag that chooses where reports go
  recipe = argparse.Namespace(lr=1e-4, epochs=3, seeds=2, first_seed=0, json="")
  first = parity_device.piece(str(tmp_path), "v2.0-bertjax-0", recipe, SELECTION, run(50.0))
  assert first == [{"f1": 50.0}, 1.5, 2] and calls == [50.0]
  # Another seed range or report path is the same recipe: read back, not rerun (nor its new value returned).
  same = argparse.Namespace(lr=1e-4, epochs=3, seeds=1, first_seed=1, json="/tmp/r.json")
  assert parity_device.piece(str(tmp_path), "v2.0-bertjax-0", same, SELECTION, run(0.0)) == first and calls == [50.0]
  # Another learning rate, or another piece's name, runs.
  other = argparse.Namespace(lr=2e-4, epochs=3, seeds=2, first_seed=0, json="")
  assert parity_device.piece(str(tmp_path), "v2.0-bertjax-0", other, SELECTION, run(60.0))[0] == {"f1": 60.0}
  assert parity_device.piece(str(tmp_path), "v2.0-pytorch-0", recipe, SELECTION, run(49.0))[0] == {"f1": 49.0}
  assert calls == [50.0, 60.0, 49.0]
  assert not list(tmp_path.glob("pieces/*.tmp"))  # written whole, then moved into place


def test_parity_gpu_sh_carries_finished_pieces_out_and_back_in(tmp_path):
  """parity_gpu.sh copies each piece's finished seed-sides to OUT/pieces/NAME/ (what comes back from a leased machine)
  and PARITY_PIECES puts them back into a fresh work dir; a stand-in python writes one piece per run and records
  what it found, so no GPU is needed."""
  import subprocess

  fake = tmp_path / "python"
  fake.write_text("#!/usr/bin/env bash\n"  # --work_dir=W: list W/pieces into OUT/found.txt, then finish a new piece
                  'for a in "$@"; do case "$a" in --work_dir=*) w="${a#--work_dir=}" ;; esac; done\n'
                  'ls "$w/pieces" > "$FOUND"; echo "{}" > "$w/pieces/rte-bertjax-$RANDOM.json"\n')
  fake.chmod(0o755)
  script = os.path.join(os.path.dirname(parity_device.__file__), "parity_gpu.sh")

  def run(out, work, **env):
    env = dict(os.environ, PYTHON=str(fake), PARITY_ONLY="rte", PARITY_WORK=str(work), FOUND=str(tmp_path / "found"),
               **env)
    subprocess.run(["bash", script, str(out)], env=env, capture_output=True, text=True, timeout=60)
    return sorted(p.name for p in (out / "pieces" / "rte").glob("*.json")), (tmp_path / "found").read_text().split()

  first, found = run(tmp_path / "out1", tmp_path / "work1")
  assert len(first) == 1 and found == []  # a fresh machine: nothing to reuse; the finished piece came out
  second, found = run(tmp_path / "out2", tmp_path / "work2", PARITY_PIECES=str(tmp_path / "out1" / "pieces"))
  assert found == first and len(second) == 2 and first[0] in second  # put back before the run, and out again


def test_qa_parity_pytorch_side_resumes_where_it_was_stopped(tmp_path, monkeypatch, capsys):
  """qa_parity --checkpoint_every: a PyTorch side stopped mid-training resumes from its state file and ends with the
  parameters of a run never stopped (model, AdamW moments, schedule and dropout RNG all carried)."""
  import argparse

  import qa_parity
  import transformers
  from bertjax.finetune import train
  from conftest import tiny_hf_checkpoint
  from test_squad import _tiny_squad

  data = tmp_path / "data"
  data.mkdir()
  args = argparse.Namespace(checkpoint=tiny_hf_checkpoint(tmp_path, _tiny_squad(str(data), 100, 8, "2.0")),
                            seq_len=32, doc_stride=8, lr=1e-3, epochs=1, paired=1, checkpoint_every=0,
                            batch_size=8, warmup_fraction=0.3)
  config = qa_parity.bertjax_config(args, "2.0", str(data), 0)
  config.task.max_query_length = 8
  setup = train.prepare(config)
  assert len(setup["train"]["input_ids"]) > 8 * 6  # more steps after the stop than before it, warmup among them
  models, schedules = [], []
  load, schedule = transformers.BertForQuestionAnswering.from_pretrained, transformers.get_linear_schedule_with_warmup
  monkeypatch.setattr(transformers.BertForQuestionAnswering, "from_pretrained",
                      lambda *a, **k: models.append(load(*a, **k)) or models[-1])
  monkeypatch.setattr("transformers.get_linear_schedule_with_warmup",  # the module run_torch's import finds
                      lambda opt, *steps: schedules.append(steps) or schedule(opt, *steps))
  straight = qa_parity.run_torch(args, config, setup, 0)[0]
  # --batch_size and --warmup_fraction reach both sides alike: bertjax's step counts are the PyTorch loop's, and its
  # warmup is transformers' own count for a fractional --warmup_steps
  total, warmup = train.step_counts(config, len(setup["train"]["input_ids"]))
  assert schedules == [(warmup, total)] and total == -(-len(setup["train"]["input_ids"]) // 8)
  hf_args = types.SimpleNamespace(warmup_steps=0.3)  # TrainingArguments itself needs accelerate, not in the extra
  assert warmup == transformers.TrainingArguments.get_warmup_steps(hf_args, total) > 1
  args.checkpoint_every, state_file = 2, str(tmp_path / "side.pt")
  clip, calls = torch.nn.utils.clip_grad_norm_, []

  def stopped_in_step_4(*a, **k):
    calls.append(1)
    if len(calls) == 4:
      raise KeyboardInterrupt
    return clip(*a, **k)

  monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", stopped_in_step_4)
  with pytest.raises(KeyboardInterrupt):
    qa_parity.run_torch(args, config, setup, 0, state_file=state_file)
  monkeypatch.setattr(torch.nn.utils, "clip_grad_norm_", clip)
  assert torch.load(state_file, weights_only=False)["step"] == 2
  capsys.readouterr()
  resumed = qa_parity.run_torch(args, config, setup, 0, state_file=state_file)[0]
  assert f"pytorch seed 0: resumed at step 2 from {state_file}" in capsys.readouterr().out
  for (name, ours), theirs in zip(models[2].named_parameters(), models[0].parameters()):
    torch.testing.assert_close(ours, theirs, rtol=0, atol=0, msg=name)
  assert resumed == pytest.approx(straight)
