"""Config validation and the CLIs' handling of user errors: one line on stderr, exit code 2, no traceback."""

import os
import subprocess
import sys

import pytest

from bertjax import config as config_lib
from bertjax.errors import UserError
from conftest import REPO, load_config

BAD = [
    ({"model.num_heads": 7}, "not divisible by model.num_heads"),
    ({"seq_len": 1024}, "exceeds the position table"),
    ({"model.sharing": "some"}, "model.sharing"),
    ({"model.num_hidden_groups": 5}, "must divide model.num_layers"),
    ({"masking.scheme": "words"}, "masking.scheme"),
    ({"objectives.rtd": 50.0}, "needs a generator"),
    ({"objectives.mlm": 0.0, "objectives.nsp": 0.0}, "no objective"),
    ({"optimizer.name": "sgd"}, "optimizer.name"),
    ({"batch_size": 30, "grad_accum_steps": 4}, "not a positive multiple of grad_accum_steps=4"),
    ({"warmup_steps": 10, "total_steps": 5}, "warmup_steps=10 exceeds total_steps=5"),
    ({"masking.max_predictions": 129}, "masking.max_predictions=129 must be between 1 and seq_len=128"),
    ({"masking.max_predictions": -1}, "masking.max_predictions=-1"),
    ({"phases": (config_lib.phase(0.5), config_lib.phase(0.4))}, "add up to 0.9"),
    ({"phases": (config_lib.phase(0.5), config_lib.phase(0.5, seq_len=1024))}, "phases.1..seq_len=1024 exceeds"),
    ({"phases": (config_lib.phase(0.5), config_lib.phase(0.5, seq_len=64, max_predictions=65))},
     "phases.1..max_predictions=65 must be between 1 and seq_len=64"),
    ({"phases": (config_lib.phase(0.9999), config_lib.phase(0.0001))}, "phase 2 has no steps"),
    ({"phases": ({"fraction": 1.0, "seq_len": 64},)}, "make each phase with bertjax.config.phase"),
    ({"data.format": "electra2"}, "use auto, electra, single"),
    ({"data.format": "electra", "objectives.nsp": 0.0, "model.type_vocab_size": 1}, "type_vocab_size=2"),
]


def _set(c, key, value):
  node = c
  *parents, leaf = key.split(".")
  for p in parents:
    node = node[p]
  node[leaf] = value


@pytest.mark.parametrize("overrides,message", BAD)
def test_invalid_configs_are_refused_with_the_fix(overrides, message):
  c = load_config("configs/bert.py:tiny")
  for k, v in overrides.items():
    _set(c, k, v)
  with pytest.raises(UserError, match=message):
    config_lib.validate(c)


@pytest.mark.parametrize("spec", ["configs/bert.py:tiny", "configs/bert.py:base", "configs/albert.py:xxlarge",
                                  "configs/electra.py:large", "configs/roberta.py:base", "configs/bert.py:large_lamb",
                                  "configs/bert.py:tiny_two_phase"])
def test_shipped_configs_are_valid(spec):
  config_lib.validate(load_config(spec))


def _run(module, *args, cwd=REPO, env=None):
  env = dict(os.environ, **(env or {}))
  return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, capture_output=True, text=True,
                        timeout=300, env=env)


def _assert_user_error(proc, fragment):
  assert proc.returncode == 2, proc.stderr[-2000:]
  lines = [l for l in proc.stderr.strip().splitlines() if l.strip()]
  assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr[-2000:]
  assert "Traceback" not in proc.stderr and fragment in lines[0]


def test_summary_cli_reports_config_errors_on_one_line():
  proc = _run("bertjax.summary", "--config=configs/bert.py:base", "--config.model.num_heads=7")
  _assert_user_error(proc, "num_heads")


def test_train_cli_missing_and_empty_corpus(tmp_path):
  proc = _run("bertjax.train", "--config=configs/bert.py:tiny", f"--workdir={tmp_path / 'w1'}",
              f"--config.data.source=text:{tmp_path}/missing/*.txt")
  _assert_user_error(proc, "no files match")
  empty = tmp_path / "empty.txt"
  empty.write_text("\n\n")
  proc = _run("bertjax.train", "--config=configs/bert.py:tiny", f"--workdir={tmp_path / 'w2'}",
              f"--config.data.source=text:{empty}")
  _assert_user_error(proc, "holds no text")


def test_train_cli_refuses_seq_len_beyond_positions(tmp_path):
  proc = _run("bertjax.train", "--config=configs/bert.py:tiny", f"--workdir={tmp_path}", "--config.seq_len=600")
  _assert_user_error(proc, "position table")
