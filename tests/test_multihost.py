"""Real multi-process runs: 2 JAX processes of 4 CPU devices each (8 in all) on this machine, coordinated
by jax.distributed on 127.0.0.1 with gloo collectives, started as a cluster starts them:
`launch/gpu_multinode.sh --local 2` (so the documented recipe is the tested one).

In the suite: one 2-process run (tiny BERT, fsdp) that the test kills process 1 of after its step-2
checkpoint, serving several checks (the lost peer's one-line error in bounded time, rows read, one log,
complete checkpoints), and a 1-process 8-device run resumed from its checkpoint; plus cheap checks of the
launcher's local mode, per-host shard files and the supervisor's parsing. `pytest -m slow`: the
whole-trajectory comparison with a 1-process run, the reverse move (1 process -> 2), SIGTERM to both, and
losing the coordinator.
"""

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from conftest import MICRO_FLAGS, REPO, devices, read_metrics, train_cli
from bertjax.core import supervisor
from bertjax.data import pipeline, shards

LAUNCH = os.path.join(REPO, "launch", "gpu_multinode.sh")
HEARTBEAT_S = 10  # jax.distributed's heartbeat timeout for these runs: how soon a lost peer is noticed
FLAGS = ("--config.sharding=fsdp", "--config.log_every=1", "--config.eval_every=1000", "--config.checkpoint_every=2",
         f"--config.heartbeat_timeout={HEARTBEAT_S}", "--config.startup_timeout=300")


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def launch(workdir, *flags, log, processes=2, trace=None):
  """Starts `launch/gpu_multinode.sh --local N` training tiny BERT (fsdp) into workdir, 8 CPU devices in all;
  returns the Popen (its stdout and stderr go to the file `log`)."""
  env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "BERTJAX_COORDINATOR", "JAX_"))}
  env.update(**devices(8 // processes), PYTHON=sys.executable,
             BERTJAX_COORDINATOR_PORT=str(_free_port()), PYTHONPATH=REPO,
             JAX_COMPILATION_CACHE_DIR=os.environ["JAX_COMPILATION_CACHE_DIR"],
             JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0")
  if trace:
    env["BERTJAX_TRACE_ROWS"] = str(trace)
  cmd = [LAUNCH, "--local", str(processes), "--config=configs/bert.py:tiny", f"--workdir={workdir}", *MICRO_FLAGS,
         *FLAGS, *flags]
  return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)


def pids(log_path) -> dict:
  """{process id: pid} from the launcher's `launch: process I of N: pid P` lines."""
  out = {}
  for line in open(log_path):
    if line.startswith("launch: process ") and ": pid " in line:
      out[int(line.split()[2])] = int(line.split()[-1])
  return out


def wait_for(condition, proc, timeout, what):
  deadline = time.time() + timeout
  while not condition():
    assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before {what}"
    assert time.time() < deadline, f"no {what} within {timeout}s"
    time.sleep(0.2)


def logged_steps(workdir) -> list:
  path = os.path.join(workdir, "metrics.jsonl")
  return [m["step"] for m in read_metrics(workdir) if "train/loss" in m] if os.path.exists(path) else []


def kill_after_checkpoint(tmp_path, name, victim):
  """A 2-process run that process `victim` is SIGKILLed in once checkpoint 2 is complete and step 3 is
  logged; returns what the checks need."""
  workdir, trace, log_path = tmp_path / name, tmp_path / f"{name}-rows", tmp_path / f"{name}.log"
  with open(log_path, "w") as log:
    proc = launch(workdir, "--config.total_steps=40", log=log, trace=trace)
  try:
    wait_for(lambda: os.path.isdir(workdir / "checkpoints" / "2") and max(logged_steps(workdir), default=0) >= 3,
             proc, 600, "step-2 checkpoint and step-3 log")
    os.kill(pids(log_path)[victim], signal.SIGKILL)
    killed = time.time()
    rc = proc.wait(timeout=4 * HEARTBEAT_S + 60)  # bounded: a hang fails here
    return dict(workdir=workdir, trace=trace, rc=rc, seconds=time.time() - killed, output=open(log_path).read())
  finally:
    if proc.poll() is None:
      proc.kill()


def error_lines(output) -> list:
  return [line for line in output.splitlines() if line.startswith("error:")]


@pytest.mark.slow  # > 15 s cold: the normal tier stays under 8 minutes (README)
def test_a_killed_two_process_run(tmp_path):
  """One 2-process run, process 1 SIGKILLed after the step-2 checkpoint, checked four ways (one test, so
  that pytest-xdist cannot run the 2-process run twice for tests on two workers)."""
  run = kill_after_checkpoint(tmp_path, "lost-peer", victim=1)
  check_a_lost_peer_ends_the_other_with_one_line_in_bounded_time(run)
  check_each_process_read_only_its_own_rows_of_every_global_batch(run)
  check_process_0_alone_logs_and_every_checkpoint_holds_both_processes(run)
  check_the_two_process_checkpoint_resumes_in_one_process_at_the_same_next_step_loss(run, tmp_path)


def check_a_lost_peer_ends_the_other_with_one_line_in_bounded_time(lost_peer):
  out = lost_peer["output"]
  assert lost_peer["rc"] == 75, out[-3000:]  # the survivor's exit code, which the launcher passes on
  assert "launch: process 0 exited with 75" in out
  errors = error_lines(out)
  assert len(errors) == 1 and errors[0].startswith("error: lost process 1 of 2"), errors
  assert "last complete checkpoint is step" in errors[0]
  assert "Traceback" not in out and "Check failure" not in out and "Fatal Python error" not in out
  assert lost_peer["seconds"] < 2 * HEARTBEAT_S + 45, lost_peer["seconds"]


def _expected_rows(of, step, batch_size, process, processes, seed):
  """The row indices `pipeline.batch_at` takes for `process` at `step`."""
  taken = []

  class Rows:
    def __len__(self):
      return of

    def take(self, idx):
      taken.append(np.asarray(idx))
      return {}

  pipeline.batch_at(Rows(), step, batch_size, seed, process, processes)
  return taken[0].tolist()


def check_each_process_read_only_its_own_rows_of_every_global_batch(lost_peer):
  reads = {p: [json.loads(line) for line in open(lost_peer["trace"] / f"rows-process-{p}.jsonl")] for p in (0, 1)}
  train = {p: [r for r in reads[p] if r["split"] == "train"] for p in (0, 1)}
  seed = json.load(open(lost_peer["workdir"] / "config.json"))["seed"]
  steps = min(len(train[0]), len(train[1]))
  assert steps >= 3
  for step in range(steps):
    mine, theirs = train[0][step]["rows"], train[1][step]["rows"]
    of = train[0][step]["of"]
    assert len(mine) == len(theirs) == 8  # batch 16 over 2 processes
    assert mine == _expected_rows(of, step, 16, 0, 2, seed) and theirs == _expected_rows(of, step, 16, 1, 2, seed)
    assert mine + theirs == _expected_rows(of, step, 16, 0, 1, seed)  # together: exactly one process's batch
  assert not [r for r in reads[0] + reads[1] if r["split"] == "eval"]  # no eval before step 1000


def check_process_0_alone_logs_and_every_checkpoint_holds_both_processes(lost_peer):
  workdir = lost_peer["workdir"]
  assert len([f for f in os.listdir(workdir) if f.startswith("events.out")]) == 1
  assert [f for f in os.listdir(workdir) if f.endswith(".jsonl")] == ["metrics.jsonl"]
  steps = logged_steps(workdir)
  assert steps == list(range(1, len(steps) + 1))  # one line per step: not written twice
  complete = sorted(int(d) for d in os.listdir(workdir / "checkpoints") if d.isdigit())
  assert complete and complete[0] == 2
  for step in complete:
    state = workdir / "checkpoints" / str(step) / "state"
    assert {"ocdbt.process_0", "ocdbt.process_1", "commit_success.txt"} <= set(os.listdir(state))


def _resume_copy(workdir, to, step):
  """A copy of a run's workdir holding only config.json and its checkpoint `step` (where it resumes)."""
  os.makedirs(to / "checkpoints")
  shutil.copy(workdir / "config.json", to / "config.json")
  shutil.copytree(workdir / "checkpoints" / str(step), to / "checkpoints" / str(step))
  return to


def _loss(workdir, step):
  return next(m["train/loss"] for m in read_metrics(workdir) if m["step"] == step and "train/loss" in m)


def check_the_two_process_checkpoint_resumes_in_one_process_at_the_same_next_step_loss(lost_peer, tmp_path):
  """Restore onto another topology: the last complete checkpoint of the killed 2-process run loads in one
  process of 8 devices, and its next step's loss is the 2-process run's."""
  resumed = _resume_copy(lost_peer["workdir"], tmp_path / "one", 2)
  r = train_cli(resumed, "--config.sharding=fsdp", "--config.log_every=1", "--config.eval_every=1000",
                "--config.checkpoint_every=2", "--config.total_steps=3",
                env=devices(8), timeout=600)
  assert r.returncode == 0, r.stderr[-2000:]
  assert "resumed from" in r.stdout + r.stderr
  assert _loss(resumed, 3) == pytest.approx(_loss(lost_peer["workdir"], 3), rel=1e-5)


def test_a_host_maps_only_the_shard_files_holding_its_rows(tmp_path):
  """With `shards:`, a host opens a shard file only when one of its rows of the global batch is in it."""
  dtype = shards.row_dtype([["input_ids", "<u2"]], 4)
  writer = shards.ShardWriter(str(tmp_path), "train", dtype)
  writer.rows_per_shard = 10  # 8 files of 10 rows
  writer.write(shards.to_records({"input_ids": np.arange(320).reshape(80, 4) % 7}, dtype))
  files = writer.close()
  for process in range(4):
    rows = shards.Rows(str(tmp_path), files, dtype)
    batch = pipeline.batch_at(rows, 3, 8, 0, process, 4)  # 2 rows each of a global batch of 8
    mine = _expected_rows(80, 3, 8, process, 4, 0)
    assert (batch["input_ids"] == np.arange(320).reshape(80, 4)[mine] % 7).all()
    assert rows.opened == sorted({files[i // 10]["file"] for i in mine})  # at most 2 of the 8 files


def test_the_local_mode_gives_each_process_a_clusters_variables():
  env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "BERTJAX_", "JAX_"))}
  r = subprocess.run([LAUNCH, "--dry-run", "--local", "2", "--config=configs/bert.py:tiny"], env=env,
                     capture_output=True, text=True, timeout=60)
  assert r.returncode == 0, r.stderr
  for i in (0, 1):
    assert f"JAX_PROCESS_ID={i}\n" in r.stdout and f"launch: process {i} of 2: pid" in r.stderr
  assert r.stdout.count("JAX_COORDINATOR_ADDRESS=127.0.0.1:12355\n") == 2 and r.stdout.count("JAX_NUM_PROCESSES=2") == 2
  bad = subprocess.run([LAUNCH, "--local", "two"], env=env, capture_output=True, text=True, timeout=60)
  assert bad.returncode == 2 and bad.stderr.strip().splitlines() == ["error: --local takes the number of processes, got 'two'"]


def test_a_process_whose_peers_never_start_stops_with_one_line(tmp_path):
  """Bounded start: joining gives up after --config.startup_timeout with one line, exit 2, nothing written."""
  env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "BERTJAX_", "JAX_"))}
  env.update(JAX_NUM_PROCESSES="2", JAX_PROCESS_ID="0", JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{_free_port()}",
             PYTHONPATH=REPO, BERTJAX_CACHE=os.environ["BERTJAX_CACHE"])
  r = subprocess.run([sys.executable, "-m", "bertjax.train", "--config=configs/bert.py:tiny", "--config.startup_timeout=5",
                      f"--workdir={tmp_path / 'run'}"], cwd=REPO, env=env, capture_output=True, text=True, timeout=180)
  assert r.returncode == 2, r.stderr[-2000:]
  lines = [line for line in r.stderr.splitlines() if not line.startswith("[Gloo]")]
  assert lines == [f"error: process 0 of 2 could not join the job at {env['JAX_COORDINATOR_ADDRESS']} within "
                   "--config.startup_timeout: start the same command on every process, with process 0 reachable at "
                   "that address"], lines
  assert not (tmp_path / "run").exists()


def test_the_supervisor_names_the_lost_process_from_jax_distributed_reports():
  coordinator_report = ("E1123 07:37:16.083539   15850 coordination_service.cc:1549] [1788] Use error polling to "
                        "propagate the following error to all tasks: UNAVAILABLE: The following tasks are unhealthy "
                        "(stopped sending heartbeats):\n1\nThe tasks have crashed.\n")
  assert supervisor._FATAL.search(coordinator_report.splitlines()[0])
  assert supervisor.lost_process(coordinator_report, 0, 2) == "process 1"
  assert supervisor.lost_process(coordinator_report.replace("\n1\n", "\n1,3\n"), 0, 4) == "processes 1, 3"
  other_report = ("F1123 07:39:55.791128   21492 client.h:80] Terminating process because the JAX distributed service "
                  "detected fatal errors. ... UNAVAILABLE: Failed to send RPC to coordination service. ... Socket closed")
  assert supervisor.lost_process(other_report, 1, 4) == "process 0 (the coordinator)"
  assert supervisor.lost_process("Traceback (most recent call last):\nValueError: x\n", 0, 2) is None
  assert supervisor.wanted({"JAX_NUM_PROCESSES": "2"}) and not supervisor.wanted({"JAX_NUM_PROCESSES": "1"})
  assert not supervisor.wanted({"JAX_NUM_PROCESSES": "2", "BERTJAX_SUPERVISED": "1"})
  assert not supervisor.wanted({"JAX_NUM_PROCESSES": "2", "BERTJAX_SUPERVISE": "0"})


# ---------------------------------------------------------------- slow: the heavier half


def run_to_end(tmp_path, name, *flags, processes=2):
  workdir, log_path = tmp_path / name, tmp_path / f"{name}.log"
  with open(log_path, "w") as log:
    proc = launch(workdir, *flags, log=log, processes=processes)
  try:
    rc = proc.wait(timeout=900)
  finally:
    if proc.poll() is None:
      proc.kill()
  assert rc == 0, open(log_path).read()[-3000:]
  return workdir


@pytest.mark.slow
def test_two_processes_follow_the_one_process_trajectory_and_checkpoints_move_both_ways(tmp_path):
  two = run_to_end(tmp_path, "two", "--config.total_steps=4")
  one = tmp_path / "one"
  r = train_cli(one, "--config.total_steps=4", *FLAGS, env=devices(8))
  assert r.returncode == 0, r.stderr[-2000:]
  assert [_loss(two, s) for s in range(1, 5)] == pytest.approx([_loss(one, s) for s in range(1, 5)], rel=1e-5)
  # The 1-process checkpoint resumes in 2 processes, at the same next-step loss.
  moved = _resume_copy(one, tmp_path / "moved", 2)
  run_to_end(tmp_path, "moved", "--config.total_steps=3")
  assert _loss(moved, 3) == pytest.approx(_loss(one, 3), rel=1e-5)


@pytest.mark.slow
def test_sigterm_to_both_processes_saves_one_step_and_both_exit_0(tmp_path):
  workdir, log_path = tmp_path / "term", tmp_path / "term.log"
  with open(log_path, "w") as log:
    proc = launch(workdir, "--config.total_steps=40", "--config.checkpoint_every=100", log=log)
  try:
    wait_for(lambda: max(logged_steps(workdir), default=0) >= 3, proc, 600, "step-3 log")
    for pid in pids(log_path).values():  # a preempted slice: every host gets its SIGTERM, each at its own step
      os.kill(pid, signal.SIGTERM)
    rc = proc.wait(timeout=120)
  finally:
    if proc.poll() is None:
      proc.kill()
  out = open(log_path).read()
  assert rc == 0, out[-3000:]
  saved = [d for d in os.listdir(workdir / "checkpoints") if d.isdigit()]
  assert len(saved) == 1 and 3 <= int(saved[0]) < 40, saved
  assert out.count("preempted: saved step") == 1  # process 0 reports it, once


@pytest.mark.slow
def test_losing_the_coordinator_ends_the_other_process_with_one_line(tmp_path):
  r = kill_after_checkpoint(tmp_path, "lost-coordinator", victim=0)
  assert r["rc"] != 0
  errors = error_lines(r["output"])
  assert len(errors) == 1 and errors[0].startswith("error: lost process 0 (the coordinator) of 2"), errors
  assert "Traceback" not in r["output"]
  assert r["seconds"] < 2 * HEARTBEAT_S + 45
