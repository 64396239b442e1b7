"""Training phases and the recipe values they carry: boundaries, per-phase shapes and masking budgets, the
learning rate continuing or restarting at a boundary, warmup as a share of the run, and `summary`'s recipe.
(The loop running them, and resuming inside phase 2 and at the boundary: tests/test_checkpoint.py.)"""

import pytest

from bertjax import summary
from bertjax.core import config as config_lib
from bertjax.objectives import masking
from bertjax.train import build, optim
from conftest import load_config
from torch_reference import SCHEDULES  # the schedules as transcribed from their sources


def _plan(config):
  return [(p.start, p.end, p.config.seq_len, p.config.batch_size, config_lib.max_predictions(p.config))
          for p in config_lib.phases(config)]


def test_bert_base_is_90_percent_at_128_then_10_percent_at_512():
  assert _plan(load_config("configs/bert.py:base")) == [(0, 900_000, 128, 256, 20), (900_000, 1_000_000, 512, 256, 80)]


def test_phase_boundaries_follow_total_steps():
  c = load_config("configs/bert.py:tiny_two_phase")
  assert _plan(c) == [(0, 540, 64, 32, 10), (540, 600, 128, 32, 20)]
  c.total_steps = 40
  assert [p[:2] for p in _plan(c)] == [(0, 36), (36, 40)]


def test_a_run_without_phases_is_one_phase_of_the_config_itself():
  c = load_config("configs/albert.py:base")
  (only,) = config_lib.phases(c)
  assert only.config is c and (only.start, only.end) == (0, c.total_steps)
  assert config_lib.max_predictions(c) == 20 and c.seq_len == 512  # ALBERT's budget, not ceil(512 x 0.15) = 77


def test_a_continuing_phase_keeps_the_runs_schedule():
  c = load_config("configs/bert.py:base")
  lr = optim.lr_schedule(c)
  ref = lambda t: 1e-4 * SCHEDULES["linear"](t, 10_000, 1_000_000)
  for t in (0, 5_000, 10_000, 899_999, 900_000, 900_001, 999_999):
    assert float(lr(t)) == pytest.approx(ref(t), rel=1e-5, abs=1e-12), t


def test_phases_with_their_own_rate_restart_the_schedule():
  """configs/bert.py:large_lamb (NVIDIA's LAMB recipe): each phase warms up and decays on its own."""
  c = load_config("configs/bert.py:large_lamb")
  (p1, p2) = config_lib.phases(c)
  assert (p1.steps, p1.config.batch_size, p2.steps, p2.config.batch_size) == (7_038, 65_536, 1_563, 32_768)
  lr = optim.lr_schedule(c)
  w1, w2 = round(0.2843 * 7_038), round(0.128 * 1_563)
  for t in (0, w1 // 2, w1, 5_000, 7_037):
    assert float(lr(t)) == pytest.approx(6e-3 * SCHEDULES["poly_sqrt"](t, w1, 7_038), rel=1e-5, abs=1e-12), t
  for t in (7_038, 7_038 + w2 // 2, 7_038 + w2, 8_600):
    expected = 4e-3 * SCHEDULES["poly_sqrt"](t - 7_038, w2, 1_563)
    assert float(lr(t)) == pytest.approx(expected, rel=1e-5, abs=1e-12), t


def test_warmup_as_a_fraction_keeps_the_recipe_shape_when_the_run_is_shortened():
  c = load_config("configs/bert.py:tiny")
  assert config_lib.warmup_steps(c) == 60
  c.total_steps = 40
  build.validate(c)  # the tiny warmup was a fixed 60 steps once: total_steps=40 was refused
  assert config_lib.warmup_steps(c) == 4
  assert float(optim.lr_schedule(c)(4)) == pytest.approx(c.learning_rate * (1 - 4 / 40))


def test_max_predictions_is_honoured_by_the_masking_config():
  c = load_config("configs/bert.py:tiny")
  c.masking.max_predictions = 7
  from bertjax.data.tokenizer import SPM_SPECIAL

  assert masking.make_config(c, SPM_SPECIAL).max_predictions == 7


def test_summary_prints_the_recipe():
  text = summary.summarize(load_config("configs/bert.py:base"))
  assert "phase 1: 900,000 steps x batch 256 x seq_len 128, max_predictions 20" in text
  assert "phase 2: 100,000 steps x batch 256 x seq_len 512, max_predictions 80" in text
  assert f"recipe: 2 phases, 1,000,000 steps, {900_000 * 256 * 128 + 100_000 * 256 * 512:,} tokens" in text
  assert "seq_len 512, max_predictions 20" in summary.summarize(load_config("configs/albert.py:base"))



def test_one_shape_clis_compile_the_phase_at_the_given_seq_len():
  """aot and bench (--phase, default 0): the phase trained at --config.seq_len, else the run's shapes as given;
  an explicit --phase wins."""
  c = load_config("configs/bert.py:large")
  assert config_lib.phase_config(c).seq_len == 128
  c.seq_len, c.batch_size = 512, 256
  second = config_lib.phase_config(c)
  assert (second.seq_len, second.batch_size, config_lib.max_predictions(second)) == (512, 256, 80)
  c.seq_len = 256  # no phase trains at 256: the shapes as given
  assert config_lib.phase_config(c).seq_len == 256 and config_lib.max_predictions(config_lib.phase_config(c)) == 39
  assert config_lib.phase_config(c, 1).seq_len == 128
  with pytest.raises(config_lib.UserError, match="--phase=3"):
    config_lib.phase_config(c, 3)
