"""Fault soak: a tiny model trained to the end through kills, a corrupted shard and a full disk, against an
uninterrupted run of the same command.

  python benchmarks/faults.py                 # 20 kills (SIGKILL or SIGTERM at random steps, seed 0)
  python benchmarks/faults.py --faults=10 --seed=3 --keep=/tmp/faults

What it does, each run a separate `python -m bertjax.train` process as a user or a scheduler starts it:
1. Prepares the demo corpus once into shards (`python -m bertjax.data.prepare`) and trains a tiny BERT on
   `shards:DIR` uninterrupted: the reference final parameters.
2. Trains the same command in another workdir, and `--faults` times, at a step drawn at random (seeded)
   among those the run has not reached yet, kills it with SIGKILL (a lost VM) or SIGTERM (a preemption:
   the run saves and exits 0), then starts the same command again. Once, before a restart, one byte of a
   shard is changed: the restart must stop with exit 2 and one line naming the file; the byte is put back
   and the job restarted. Once, after a checkpoint, the running trainer's file-size limit drops to 64 KiB
   (RLIMIT_FSIZE: the next checkpoint cannot be written, as on a full disk): it must stop with exit 2 and
   one line; the limit is gone in the next process.
3. Prints the faults injected and survived (a kill is survived when the next start resumes from a
   complete checkpoint and the job goes on; the shard and the disk when the run refused with exit 2 and one
   line and the next start resumed), and whether the final parameters equal the uninterrupted run's bit
   for bit.
"""

import argparse
import json
import os
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = ("--config=configs/bert.py:tiny", "--config.model.hidden_size=64", "--config.model.intermediate_size=128",
        "--config.seq_len=64", "--config.batch_size=16", "--config.data.dupe_factor=1", "--config.warmup_steps=2")


def _env() -> dict:
  env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
  env.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(tempfile.gettempdir(), "bertjax-faults-jax-cache"))
  env.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
  return env


def _train_cmd(workdir: str, shards: str, steps: int) -> list:
  return [sys.executable, "-m", "bertjax.train", *TINY, f"--workdir={workdir}", f"--config.data.source=shards:{shards}",
          f"--config.total_steps={steps}", "--config.log_every=1", "--config.eval_every=100000",
          "--config.checkpoint_every=2"]


class Attempt:
  """One start of the training command; its stdout + stderr go to a log file."""

  def __init__(self, cmd: list, log_path: str, workdir: str):
    self.log_path, self.metrics = log_path, os.path.join(workdir, "metrics.jsonl")
    self.offset = os.path.getsize(self.metrics) if os.path.exists(self.metrics) else 0
    self.log = open(log_path, "w")
    self.proc = subprocess.Popen(cmd, cwd=REPO, env=_env(), stdout=self.log, stderr=subprocess.STDOUT)

  def steps(self) -> list:
    """The train steps this attempt logged so far."""
    if not os.path.exists(self.metrics):
      return []
    with open(self.metrics) as f:
      f.seek(self.offset)
      lines = f.read().splitlines()
    out = []
    for line in lines:
      try:
        m = json.loads(line)
      except ValueError:  # a line being written
        continue
      if "train/loss" in m:
        out.append(m["step"])
    return out

  def wait(self, timeout: float = 900) -> tuple:
    """(exit code, output) once it ends."""
    rc = self.proc.wait(timeout=timeout)
    self.log.close()
    return rc, open(self.log_path).read()


def _errors(output: str) -> list:
  return [line for line in output.splitlines() if line.startswith("error:")]


def _resumed(output: str):
  """The step a start resumed from, 0 for a fresh start, None if it did neither."""
  for line in output.splitlines():
    if "resumed from" in line and " at step " in line:
      return int(line.rsplit(" at step ", 1)[1].split()[0])
  return 0 if "model:" in output else None


def _params(workdir: str):
  """The final checkpoint's params as flat {path: numpy array} (restored without a target)."""
  import warnings

  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  warnings.filterwarnings("ignore", message="Sharding info not provided")  # one topology here
  import jax
  import orbax.checkpoint as ocp

  directory = os.path.join(workdir, "checkpoints")
  mgr = ocp.CheckpointManager(directory, item_names=("state", "manifest"))
  step = mgr.latest_step()
  state = mgr.restore(step, args=ocp.args.Composite(state=ocp.args.PyTreeRestore()))["state"]
  flat = jax.tree_util.tree_flatten_with_path(state["params"])[0]
  return step, {jax.tree_util.keystr(k): jax.device_get(v) for k, v in flat}


def _wait_step(attempt: Attempt, target: int, timeout: float = 600) -> bool:
  """Waits until the attempt logs a step >= target (or any step if it resumed past it); False if it ended."""
  deadline = time.time() + timeout
  while time.time() < deadline:
    steps = attempt.steps()
    if steps and max(steps) >= target:
      return True
    if attempt.proc.poll() is not None:
      return False
    time.sleep(0.05)
  raise TimeoutError(f"no step {target} within {timeout}s; see {attempt.log_path}")


def _flip_byte(path: str, at: int) -> int:
  with open(path, "r+b") as f:
    f.seek(at)
    old = f.read(1)[0]
    f.seek(at)
    f.write(bytes([old ^ 0xFF]))
  return old


def main():
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--faults", type=int, default=20, help="kills (SIGKILL or SIGTERM) at random steps")
  p.add_argument("--seed", type=int, default=0, help="seeds the kill steps and signals")
  p.add_argument("--steps_between", type=int, default=3, help="train steps per fault, on average")
  p.add_argument("--keep", default="", help="a directory to keep the workdirs and logs in (default: a temp dir)")
  args = p.parse_args()
  root = args.keep or tempfile.mkdtemp(prefix="bertjax-faults-")
  os.makedirs(root, exist_ok=True)
  env = _env()
  env["BERTJAX_CACHE"] = os.path.join(root, "cache")
  os.environ.update(BERTJAX_CACHE=env["BERTJAX_CACHE"])
  total = args.steps_between * (args.faults + 3) + 4
  rng = random.Random(args.seed)
  t0 = time.time()

  # ---------------------------------------------------------------- 1. shards, and the uninterrupted run
  shards = os.path.join(root, "shards")
  if not os.path.exists(os.path.join(shards, "metadata.json")):
    r = subprocess.run([sys.executable, "-m", "bertjax.data.prepare", *TINY, f"--out={shards}", "--workers=0"], cwd=REPO,
                       env=env, capture_output=True, text=True)
    if r.returncode:
      sys.exit(f"prepare failed: {r.stderr[-2000:]}")
  reference = os.path.join(root, "uninterrupted")
  shutil.rmtree(reference, ignore_errors=True)
  rc, out = Attempt(_train_cmd(reference, shards, total), os.path.join(root, "uninterrupted.log"), reference).wait()
  if rc:
    sys.exit(f"the uninterrupted run failed ({rc}): {out[-2000:]}")
  print(f"faults: uninterrupted run of {total} steps done [{time.time() - t0:.0f}s]", flush=True)

  # ---------------------------------------------------------------- 2. the same command through faults
  workdir = os.path.join(root, "faulted")
  shutil.rmtree(workdir, ignore_errors=True)
  cmd = _train_cmd(workdir, shards, total)
  targets = sorted(rng.sample(range(1, total), args.faults + 1))  # one of them fills the disk instead of a kill
  corrupt_before, disk_full_at = rng.randrange(args.faults + 1), rng.randrange(args.faults + 1)
  injected, survived, problems, n = [], [], [], 0
  pending = None  # the fault the next start must survive: (name, checkpoint step at most)

  def start():
    nonlocal n
    n += 1
    return Attempt(cmd, os.path.join(root, f"attempt-{n:02d}.log"), workdir)

  def check_start(attempt: Attempt, output: str):
    """Whether this start resumed from a complete checkpoint (or began afresh before any was saved)."""
    resumed = _resumed(output)
    if pending is not None:
      if resumed is None:
        problems.append(f"after {pending}: the next start neither resumed nor started ({attempt.log_path})")
      else:
        survived.append(pending)

  def latest_checkpoint() -> int:
    d = os.path.join(workdir, "checkpoints")
    return max([int(x) for x in os.listdir(d) if x.isdigit()], default=0) if os.path.isdir(d) else 0

  attempt = start()
  for i, target in enumerate(targets):
    if not _wait_step(attempt, target):
      break  # it ended (finished or failed): handled below
    if i == disk_full_at:
      # A full disk at the next checkpoint: no file may grow past 64 KiB from now on.
      resource.prlimit(attempt.proc.pid, resource.RLIMIT_FSIZE, (64 << 10, resource.RLIM_INFINITY))
      rc, out = attempt.wait()
      injected.append("disk full")
      errors = _errors(out)
      if rc == 2 and len(errors) == 1 and "the disk is full" in errors[0]:
        pending = "disk full"
      else:
        problems.append(f"disk full: exit {rc}, errors {errors} ({attempt.log_path})")
    else:
      sig = rng.choice([signal.SIGKILL, signal.SIGTERM])
      attempt.proc.send_signal(sig)
      rc, out = attempt.wait()
      injected.append(f"{sig.name} at step {target}")
      pending = injected[-1]
      if sig == signal.SIGTERM and rc != 0:
        problems.append(f"SIGTERM at step {target}: exit {rc}, not a clean save ({attempt.log_path})")
    if i == corrupt_before:
      meta = json.load(open(os.path.join(shards, "metadata.json")))
      shard = os.path.join(shards, meta["splits"]["train"]["shards"][0]["file"])
      old = _flip_byte(shard, os.path.getsize(shard) // 2)
      bad = start()
      rc, out = bad.wait()
      injected.append("corrupted shard")
      errors = _errors(out)
      if rc == 2 and len(errors) == 1 and shard in errors[0] and "corrupt" in errors[0]:
        survived.append("corrupted shard")
      else:
        problems.append(f"corrupted shard: exit {rc}, errors {errors} ({bad.log_path})")
      _flip_byte(shard, os.path.getsize(shard) // 2)  # repaired (prepared again, in real life)
      assert open(shard, "rb").read()[os.path.getsize(shard) // 2] == old
    attempt = start()
    # The start's first lines say where it resumed; wait for them before the next fault.
    while _resumed(open(attempt.log_path).read()) is None and attempt.proc.poll() is None:
      time.sleep(0.05)
    check_start(attempt, open(attempt.log_path).read())
    pending = None
  rc, out = attempt.wait()
  if rc != 0:
    problems.append(f"the last start ended with exit {rc}: {_errors(out)} ({attempt.log_path})")

  # ---------------------------------------------------------------- 3. the verdict
  ref_step, ref = _params(reference)
  got_step, got = _params(workdir)
  identical = ref_step == got_step == total and ref.keys() == got.keys() and all(
      ref[k].dtype == got[k].dtype and ref[k].tobytes() == got[k].tobytes() for k in ref)
  kills = [f for f in injected if f.startswith("SIG")]
  print(f"faults injected: {len(injected)} ({len(kills)} kills: "
        f"{sum(f.startswith('SIGKILL') for f in kills)} SIGKILL, {sum(f.startswith('SIGTERM') for f in kills)} SIGTERM; "
        f"{injected.count('corrupted shard')} corrupted shard; {injected.count('disk full')} disk full)")
  print(f"faults survived: {len(survived)} of {len(injected)} (kills {sum(s.startswith('SIG') for s in survived)} of "
        f"{len(kills)}, corrupted shard {survived.count('corrupted shard')} of {injected.count('corrupted shard')}, "
        f"disk full {survived.count('disk full')} of {injected.count('disk full')}); {n} starts of the job")
  clean = identical and not problems and len(survived) == len(injected)
  kept = args.keep or not clean  # a failure keeps its workdirs and logs to look at
  print(f"final parameters bit-identical to the uninterrupted run's: {'yes' if identical else 'NO'} "
        f"(step {got_step} vs {ref_step}, {len(ref)} arrays) [{time.time() - t0:.0f}s"
        + (f"; workdirs and logs in {root}]" if kept else "]"))
  for problem in problems:
    print(f"problem: {problem}")
  if not kept:
    shutil.rmtree(root, ignore_errors=True)
  sys.exit(0 if clean else 1)


if __name__ == "__main__":
  from bertjax.core import cli

  cli.script(main)
