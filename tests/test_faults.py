"""Faults a long multi-process run meets (docs/integrity.md): a peer that stops answering (SIGSTOP) ends the
others through XLA:CPU's collective timeout with one line and exit 75, a lost peer among three processes
gives the same line as with two, and a rerun resumes on the uninterrupted run's losses. Real processes,
started by launch/gpu_multinode.sh --local as in tests/test_multihost.py; `pytest -m slow`."""

import os
import signal
import time

import pytest

from conftest import read_metrics
from test_multihost import error_lines, launch, logged_steps, pids, wait_for

STEP_TIMEOUT_S = 60  # the collective timeout of these runs: more than the two processes' compile-time skew
# jax.distributed's heartbeat timeout, longer than the collective timeout: a SIGSTOPped process stops its
# heartbeats too, and the collective timeout is the thing under test.
QUIET = ("--config.heartbeat_timeout=300", f"--config.runtime.step_timeout_s={STEP_TIMEOUT_S}")


def _training_pid(supervisor_pid: int) -> int:
  """The supervised child (the process that trains) of a launched process's supervisor."""
  with open(f"/proc/{supervisor_pid}/task/{supervisor_pid}/children") as f:
    return int(f.read().split()[0])


def _losses(workdir) -> dict:
  return {m["step"]: m["train/loss"] for m in read_metrics(workdir) if "train/loss" in m}


def _run(tmp_path, name, *flags, processes=2, workdir=None, timeout=900):
  workdir = workdir or tmp_path / name
  log_path = tmp_path / f"{name}.log"
  with open(log_path, "w") as log:
    proc = launch(workdir, *flags, log=log, processes=processes)
  try:
    rc = proc.wait(timeout=timeout)
  finally:
    if proc.poll() is None:
      proc.kill()
  return workdir, rc, open(log_path).read()


def _stop_one(tmp_path, name, victim, processes, signum, *flags):
  """A run of `processes` whose process `victim` gets `signum` after the step-2 checkpoint and step-3 log;
  returns (workdir, exit code, seconds from the signal to the end, output)."""
  workdir, log_path = tmp_path / name, tmp_path / f"{name}.log"
  with open(log_path, "w") as log:
    proc = launch(workdir, "--config.total_steps=12", *flags, log=log, processes=processes)
  stopped = None
  try:
    wait_for(lambda: os.path.isdir(workdir / "checkpoints" / "2") and max(logged_steps(workdir), default=0) >= 3,
             proc, 600, "step-2 checkpoint and step-3 log")
    stopped = _training_pid(pids(log_path)[victim])
    os.kill(stopped, signum)
    t = time.time()
    if signum == signal.SIGSTOP:  # the others end; the stopped one is then killed, as a scheduler would
      wait_for(lambda: "launch: process 0 exited" in open(log_path).read() or victim == 0, proc, 4 * STEP_TIMEOUT_S + 60,
               "the others to exit")
    rc = proc.wait(timeout=4 * STEP_TIMEOUT_S + 120) if signum != signal.SIGSTOP else None
    seconds = time.time() - t
    if rc is None:
      os.kill(stopped, signal.SIGKILL)
      rc = proc.wait(timeout=120)
    return workdir, rc, seconds, open(log_path).read()
  finally:
    if stopped:
      try:
        os.kill(stopped, signal.SIGKILL)
      except ProcessLookupError:
        pass
    if proc.poll() is None:
      proc.kill()


@pytest.mark.slow
def test_a_stopped_peer_ends_the_other_with_one_line_and_exit_75_and_a_rerun_resumes_on_the_same_losses(tmp_path):
  full, rc, out = _run(tmp_path, "full", "--config.total_steps=12", *QUIET)
  assert rc == 0, out[-3000:]
  workdir, rc, seconds, out = _stop_one(tmp_path, "stopped", 1, 2, signal.SIGSTOP, *QUIET)
  assert rc == 75, out[-3000:]
  assert "launch: process 0 exited with 75" in out
  errors = error_lines(out)
  assert len(errors) == 1, errors
  assert errors[0].startswith("error: at step ") and f"waited more than {STEP_TIMEOUT_S}s" in errors[0], errors
  assert "for process 1 of 2" in errors[0] and "the last complete checkpoint is step" in errors[0], errors
  assert "Traceback" not in out
  assert seconds < STEP_TIMEOUT_S + 45, seconds  # the collective timeout, not the 120 s heartbeat
  # The same command again resumes from the last complete checkpoint, on the uninterrupted run's losses.
  resumed_at = max(int(d) for d in os.listdir(workdir / "checkpoints") if d.isdigit())
  _, rc, out = _run(tmp_path, "rerun", "--config.total_steps=12", *QUIET, workdir=workdir)
  assert rc == 0 and "resumed from" in out, out[-3000:]
  after = {s: l for s, l in _losses(workdir).items() if s > resumed_at}
  assert after and after == pytest.approx({s: _losses(full)[s] for s in after}, rel=1e-6)


@pytest.mark.slow
def test_a_lost_peer_among_three_processes_gives_the_two_process_line_and_exit_code(tmp_path):
  workdir, rc, seconds, out = _stop_one(tmp_path, "three", 2, 3, signal.SIGKILL, "--config.heartbeat_timeout=10",
                                         "--config.batch_size=24")  # 3 processes x 2 devices
  assert rc == 75, out[-4000:]
  errors = error_lines(out)
  assert errors and all(e.startswith("error: lost process 2 of 3") for e in errors), out[-4000:]
  assert "Traceback" not in out and "Check failure" not in out and "Fatal Python error" not in out, out[-4000:]


def test_a_fatal_report_that_names_no_process_still_gives_the_one_line_with_three_processes():
  from bertjax.core import supervisor

  bare = ("F1123 07:39:55.791128   21492 client.h:80] Terminating process because the JAX distributed service "
          "detected fatal errors. ... INTERNAL: barrier failed")
  assert supervisor.lost_process(bare, 1, 2) == "process 0"
  assert supervisor.lost_process(bare, 1, 3) == "a process (jax.distributed's report names none)"
  unhealthy = ("E1123 07:37:16.083539   15850 coordination_service.cc:1549] ... UNAVAILABLE: The following tasks are "
               "unhealthy (stopped sending heartbeats):\n2\nThe tasks have crashed.\n")
  assert supervisor.lost_process(unhealthy, 1, 3) == "process 2"  # the coordinator's news, relayed to process 1


# ------------------------------------------------------------------ a full disk while saving

SAVE_FLAGS = ("--config.total_steps=8", "--config.log_every=1", "--config.eval_every=1000", "--config.checkpoint_every=2")


@pytest.mark.slow
def test_a_full_disk_while_saving_stops_with_one_line_keeps_the_last_checkpoint_and_resumes_on_the_same_losses(tmp_path):
  import resource

  from conftest import train_cli

  full = tmp_path / "full"
  r = train_cli(full, *SAVE_FLAGS)
  assert r.returncode == 0, r.stderr[-2000:]
  workdir = tmp_path / "disk-full"
  proc = train_cli(workdir, *SAVE_FLAGS, wait=False)
  try:
    wait_for(lambda: os.path.isdir(workdir / "checkpoints" / "2") and max(logged_steps(workdir), default=0) >= 3,
             proc, 600, "step-2 checkpoint and step-3 log")
    # From now on no file of the run may grow past 64 KiB: the next checkpoint's data files cannot be written
    # (EFBIG; Python ignores SIGXFSZ), as on a full disk.
    resource.prlimit(proc.pid, resource.RLIMIT_FSIZE, (64 << 10, resource.RLIM_INFINITY))
    _, stderr = proc.communicate(timeout=300)
  finally:
    if proc.poll() is None:
      proc.kill()
  open(tmp_path / "disk-full.err", "w").write(stderr)
  assert proc.returncode == 2, stderr[-3000:]
  errors = [line for line in stderr.splitlines() if line.startswith("error:")]
  assert len(errors) == 1 and errors[0].startswith("error: the disk is full: a checkpoint write in "), stderr[-3000:]
  assert "the last complete checkpoint is step" in errors[0] and "Traceback" not in stderr
  complete = sorted(int(d) for d in os.listdir(workdir / "checkpoints") if d.isdigit())
  assert complete and complete[-1] < 8, complete
  r = train_cli(workdir, *SAVE_FLAGS)  # space again: the same command resumes from the last complete checkpoint
  assert r.returncode == 0 and f"resumed from {workdir / 'checkpoints'} at step {complete[-1]}" in r.stdout + r.stderr, \
      r.stderr[-3000:]
  after = {s: l for s, l in _losses(workdir).items() if s > complete[-1]}
  assert after and after == pytest.approx({s: _losses(full)[s] for s in after}, rel=1e-6)


def test_a_full_disk_is_recognized_in_python_and_tensorstore_errors():
  import errno

  from bertjax.train import checkpoint

  assert checkpoint.is_disk_full(OSError(errno.ENOSPC, "x")) == "no space left on device"
  wrapped = RuntimeError("save failed")
  wrapped.__cause__ = OSError(errno.EDQUOT, "x")
  assert checkpoint.is_disk_full(wrapped) == "disk quota exceeded"
  tensorstore = ValueError('OUT_OF_RANGE: Error writing "params/0" in OCDBT database: Failed to write 1368473 bytes '
                           "to file 10: File too large [os_error_code='27']")
  assert checkpoint.is_disk_full(tensorstore) == "file too large"
  assert checkpoint.is_disk_full(ValueError("shape mismatch")) == ""


def test_closed_loop_echoes_of_a_full_disk_are_dropped_whichever_comes_first_and_kept_without_one():
  import logging

  from bertjax.train.checkpoint import _DiskFullNoise

  full = logging.LogRecord("absl", logging.ERROR, "", 0, "write failed: File too large", None, None)
  for order in ("echo first", "news first", "no full disk"):
    noise, printed = _DiskFullNoise(), []
    hook = noise.wrap(lambda e: printed.append(str(e)), lambda e: e)
    if order == "news first":
      assert noise.filter(full) is False
    hook(RuntimeError("Event loop is closed"))  # tensorstore's callback into a closed loop (CI saw it before orbax's log)
    hook(ValueError("another error"))  # never held back
    if order == "echo first":
      noise.noticed()  # the run's own handler met the full disk
    noise.release()  # at exit
    want = ["another error", "Event loop is closed"] if order == "no full disk" else ["another error"]
    assert printed == want, order
