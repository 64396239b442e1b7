"""Checkpoints that never lose work: exact resume after SIGKILL, SIGTERM, partial saves, NaN guard,
the manifest, init_from, and refusing another config's workdir."""

import os
import shutil
import signal
import time

import jax
import numpy as np
import orbax.checkpoint as ocp
import pytest

from bertjax.core.errors import UserError
from bertjax.train import checkpoint, loop
from conftest import micro, read_metrics, train_cli



def _params(workdir, step):
  mgr = ocp.CheckpointManager(os.path.join(str(workdir), "checkpoints"), item_names=("state", "manifest"))
  state = mgr.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore()))["state"]
  return jax.tree.map(np.asarray, state["params"])


def _wait_for(path, proc, timeout=600):
  start = time.time()
  while not os.path.isdir(path):
    assert proc.poll() is None, proc.stderr.read()[-3000:]
    assert time.time() - start < timeout, f"{path} never appeared"
    time.sleep(0.2)


# configs/bert.py:tiny_two_phase shrunk: steps 0-10 at seq_len 64, 10-40 at 128, a save every 10 steps (all kept).
PHASED = ("--config.total_steps=40", "--config.checkpoint_every=10", "--config.keep_checkpoints=4",
          "--config.log_every=10", "--config.eval_every=40", "--config.phases[0].fraction=0.25",
          "--config.phases[1].fraction=0.75")


def _phased(workdir, **kw):
  return train_cli(workdir, *PHASED, spec="configs/bert.py:tiny_two_phase", **kw)


def _loss40(workdir):
  return [r["train/loss"] for r in read_metrics(workdir) if r["step"] == 40 and "train/loss" in r][-1]


def _resumes_to_the_same_end(workdir, whole, resumed):
  rerun = _phased(workdir)
  assert rerun.returncode == 0, rerun.stderr[-3000:]
  assert "resumed from" in rerun.stdout and any(r in rerun.stdout for r in resumed), rerun.stdout[-2000:]
  assert _loss40(workdir) == _loss40(whole)
  for x, y in zip(jax.tree.leaves(_params(whole, 40)), jax.tree.leaves(_params(workdir, 40))):
    np.testing.assert_array_equal(x, y)  # bit-identical


def _whole(tmp_path):
  whole = tmp_path / "whole"
  assert _phased(whole).returncode == 0
  assert {r["step"]: (r["phase"], r["seq_len"]) for r in read_metrics(whole) if "seq_len" in r} == {
      10: (1, 64), 20: (2, 128), 30: (2, 128), 40: (2, 128)}
  return whole


@pytest.mark.slow  # > 15 s cold: the normal tier stays under 8 minutes (README)
def test_sigkill_in_phase_2_resumes_to_the_uninterrupted_run(tmp_path):
  whole, cut = _whole(tmp_path), tmp_path / "cut"
  proc = _phased(cut, wait=False)
  _wait_for(cut / "checkpoints" / "20", proc)  # orbax renames the finished save to its step number
  proc.send_signal(signal.SIGKILL)
  proc.wait()
  _resumes_to_the_same_end(cut, whole, ("at step 20", "at step 30"))


@pytest.mark.slow
def test_resuming_at_the_phase_boundary_equals_the_uninterrupted_run(tmp_path):
  whole, boundary = _whole(tmp_path), tmp_path / "boundary"
  shutil.copytree(whole, boundary)  # the uninterrupted run's workdir with only the save at the boundary left
  for step in (20, 30, 40):
    shutil.rmtree(boundary / "checkpoints" / str(step))
  _resumes_to_the_same_end(boundary, whole, ("at step 10",))


def test_sigterm_saves_the_current_step_and_exits_0(tmp_path):
  proc = train_cli(tmp_path, "--config.total_steps=100000", "--config.checkpoint_every=100000",
                   "--config.log_every=5", "--config.eval_every=100000", wait=False)
  start = time.time()
  while not (tmp_path / "metrics.jsonl").exists() or not read_metrics(tmp_path):
    assert proc.poll() is None and time.time() - start < 600, proc.stderr.read()[-3000:]
    time.sleep(0.2)
  proc.send_signal(signal.SIGTERM)
  t = time.time()
  out, err = proc.communicate(timeout=120)
  assert proc.returncode == 0, err[-3000:]
  assert time.time() - t < 60
  assert "preempted: saved step" in out
  saved = checkpoint.Checkpointer(str(tmp_path)).latest_step()
  assert saved is not None and saved >= 5


@pytest.mark.slow  # a long compile or CLI run: the normal tier stays under 8 minutes cold
def test_a_partial_checkpoint_is_never_picked_up(tmp_path):
  c = micro(total_steps=4, checkpoint_every=2, log_every=2, eval_every=4)
  loop.train_and_evaluate(c, str(tmp_path))
  # A save killed midway leaves orbax's temporary directory (never renamed to its step).
  partial = tmp_path / "checkpoints" / "6.orbax-checkpoint-tmp-1234567890"
  partial.mkdir()
  (partial / "garbage").write_text("half written")
  assert checkpoint.Checkpointer(str(tmp_path)).latest_step() == 4
  c.total_steps = 6
  state = loop.train_and_evaluate(c, str(tmp_path))
  assert int(state.step) == 6


def test_nonfinite_steps_are_skipped_then_the_run_stops(tmp_path, monkeypatch):
  from bertjax.data import pipeline

  real = pipeline.batch_at

  def poisoned(arrays, step, *args, **kwargs):
    batch = real(arrays, step, *args, **kwargs)
    if step >= 3:
      batch["example_weight"] = np.full_like(batch["example_weight"], np.nan)
    return batch

  monkeypatch.setattr(pipeline, "batch_at", poisoned)
  c = micro(total_steps=50, log_every=1, eval_every=1000, checkpoint_every=1000, max_nonfinite_steps=4)
  with pytest.raises(UserError, match="non-finite"):
    loop.train_and_evaluate(c, str(tmp_path))
  records = [r for r in read_metrics(tmp_path) if "train/skipped" in r]
  assert [r["train/skipped"] for r in records[:3]] == [0, 0, 0] and records[3]["train/skipped"] == 1
  ckpt = checkpoint.Checkpointer(str(tmp_path))
  params = _params(tmp_path, ckpt.latest_step())
  assert all(np.isfinite(x).all() for x in jax.tree.leaves(params))
  # Skipped steps left the parameters exactly as after the last good step (3).
  norms = [r["train/param_norm"] for r in records[2:]]
  assert len(set(norms)) == 1


@pytest.mark.slow  # 11-19 s cold: the normal tier keeps under 8 minutes on 2 cores
def test_manifest_names_versions_tokenizer_mesh_and_networks(tmp_path):
  c = micro("configs/electra.py:tiny", total_steps=2, checkpoint_every=2, log_every=2, eval_every=2)
  loop.train_and_evaluate(c, str(tmp_path))
  m = checkpoint.Checkpointer(str(tmp_path)).manifest()
  for key in ("config", "bertjax", "git_commit", "jax", "flax", "optax", "orbax", "tokenizer", "mesh"):
    assert key in m, key
  assert m["tokenizer"]["fingerprint"] and m["config"]["model"]["generator_fraction"] == 0.25
  assert set(m["networks"]) == {"generator", "discriminator"}
  assert "generator_encoder" in m["networks"]["generator"] and "rtd" in m["networks"]["discriminator"]


@pytest.mark.slow  # a long compile or CLI run: the normal tier stays under 8 minutes cold
def test_workdir_of_another_config_is_refused_unless_overwrite(tmp_path):
  c = micro(total_steps=2, checkpoint_every=2, log_every=2, eval_every=2)
  loop.train_and_evaluate(c, str(tmp_path))
  other = micro(total_steps=2, checkpoint_every=2, log_every=2, eval_every=2, seed=7)
  with pytest.raises(UserError, match="another config"):
    loop.train_and_evaluate(other, str(tmp_path))
  assert checkpoint.Checkpointer(str(tmp_path)).latest_step() == 2  # untouched
  other.overwrite = True
  loop.train_and_evaluate(other, str(tmp_path))
  assert read_metrics(tmp_path)[0]["step"] == 2 and len([r for r in read_metrics(tmp_path) if "train/loss" in r]) == 1


def test_a_run_saved_before_a_config_key_existed_still_resumes(tmp_path):
  """config.json of an older bertjax lacks keys added since (here sharding_rules, data.prepare_workers):
  they take their defaults, so the run is the same config, not another one."""
  import json

  c = micro()
  saved = json.loads(c.to_json())
  del saved["sharding_rules"], saved["data"]["prepare_workers"]
  (tmp_path / "config.json").write_text(json.dumps(saved))
  assert loop.check_workdir(c, str(tmp_path)) is False  # resumable, nothing to replace
  c.seed = 7
  with pytest.raises(UserError, match="differs in seed"):
    loop.check_workdir(c, str(tmp_path))


def _saved_before_the_optimizer_switches(c, workdir):
  """Writes workdir/config.json as bertjax wrote it before optimizer.bias_correction and decay_mask (7e491a3)."""
  import json

  saved = json.loads(c.to_json())
  del saved["optimizer"]["bias_correction"], saved["optimizer"]["decay_mask"]
  os.makedirs(workdir, exist_ok=True)
  with open(os.path.join(workdir, "config.json"), "w") as f:
    json.dump(saved, f)


def test_a_run_saved_before_the_optimizer_switches_resumes_as_it_ran(tmp_path):
  """Before the switches, adamw was optax's (bias-corrected), lamb ALBERT's (uncorrected), and both left biases
  and LayerNorm undecayed: an old workdir reads with those values, not today's defaults, so it is the same
  config and resumes with the rule it ran; a config that now names another rule takes the old one."""
  lamb = micro(**{"optimizer.name": "lamb", "optimizer.bias_correction": False})
  _saved_before_the_optimizer_switches(lamb, tmp_path / "lamb")
  assert loop.check_workdir(lamb, str(tmp_path / "lamb")) is False  # not "another config"
  assert loop.resumed_config(lamb, str(tmp_path / "lamb")).optimizer.bias_correction is False

  # Today's BERT recipe says uncorrected with fairseq's mask; the old run was corrected with BERT's mask.
  adamw = micro(**{"optimizer.bias_correction": False, "optimizer.decay_mask": "all"})
  _saved_before_the_optimizer_switches(adamw, tmp_path / "adamw")
  resumed = loop.resumed_config(adamw, str(tmp_path / "adamw"))
  assert (resumed.optimizer.bias_correction, resumed.optimizer.decay_mask) == (True, "bert")
  assert loop.check_workdir(resumed, str(tmp_path / "adamw")) is False
  other = micro(seed=7, **{"optimizer.bias_correction": False, "optimizer.decay_mask": "all"})
  assert loop.resumed_config(other, str(tmp_path / "adamw")) is other  # another run: nothing taken over
  with pytest.raises(UserError, match="differs in optimizer, seed"):
    loop.check_workdir(other, str(tmp_path / "adamw"))


@pytest.mark.slow  # ~16 s: two short runs
def test_an_old_lamb_run_resumes_with_its_own_rule(tmp_path, capsys):
  """A LAMB workdir written before optimizer.bias_correction (uncorrected, ALBERT's) with its step-2 checkpoint,
  resumed with today's default (corrected): it resumes, with a note, and ends bit-identical to the run never
  interrupted."""
  kw = {"optimizer.name": "lamb", "total_steps": 3, "checkpoint_every": 2, "log_every": 1, "eval_every": 3}
  whole = micro(**kw, **{"optimizer.bias_correction": False})
  loop.train_and_evaluate(whole, str(tmp_path / "whole"))
  shutil.copytree(tmp_path / "whole", tmp_path / "old")
  shutil.rmtree(tmp_path / "old" / "checkpoints" / "3")  # as if it stopped after its step-2 save
  _saved_before_the_optimizer_switches(whole, tmp_path / "old")
  state = loop.train_and_evaluate(micro(**kw), str(tmp_path / "old"))
  assert int(state.step) == 3 and "predates optimizer.bias_correction and ran with False" in capsys.readouterr().err
  for x, y in zip(jax.tree.leaves(_params(tmp_path / "whole", 3)), jax.tree.leaves(_params(tmp_path / "old", 3))):
    np.testing.assert_array_equal(x, y)


@pytest.mark.slow  # 11-19 s cold: the normal tier keeps under 8 minutes on 2 cores
def test_init_from_loads_weights_only(tmp_path):
  c = micro(total_steps=3, checkpoint_every=3, log_every=3, eval_every=3)
  loop.train_and_evaluate(c, str(tmp_path / "source"))
  source = _params(tmp_path / "source", 3)
  c2 = micro(total_steps=1, checkpoint_every=1, log_every=1, eval_every=1, learning_rate=0.0, warmup_steps=0)
  c2.init_from = str(tmp_path / "source")
  state = loop.train_and_evaluate(c2, str(tmp_path / "new"))
  assert int(state.step) == 1  # a new run: counting from 0
  for x, y in zip(jax.tree.leaves(source), jax.tree.leaves(jax.tree.map(np.asarray, state.params))):
    np.testing.assert_array_equal(x, y)  # learning rate 0: still the source's weights
