"""A small parent for each process of a multi-process job, which turns a lost peer into one line.

When a process of a job dies (killed, out of memory, its host gone), jax.distributed notices on the
others: the coordinator (process 0) after `heartbeat_timeout` seconds without heartbeats from it, every
other process at once if the coordinator itself is gone. It then ends each surviving process from C++
(LOG(FATAL) and abort()): the collective it was blocked in would otherwise wait forever. The ending is
bounded, but it is a 60-line dump of C++ frames and Python threads with the news in the middle, and no
code in that process gets to run (jax.distributed.initialize offers no callback to replace it; jaxlib's
`missed_heartbeat_callback` crashes converting its status). So a multi-process `python -m bertjax.train`
runs itself as a child under this parent, which imports nothing heavy and
- passes the child's stdout through untouched, and its stderr line by line until jax.distributed's
  fatal-error report begins; it keeps that report back, reads from it which process was lost, and once
  the child has ended prints `error: lost process N of M ...` (naming the last complete checkpoint)
  and exits with LOST_PEER_EXIT;
- forwards SIGTERM and SIGINT to the child (a preempted slice: jax's preemption sync point then has
  every process save the same step and exit 0), and makes the child die with it (PR_SET_PDEATHSIG), so
  a parent killed by a scheduler leaves no orphan holding the devices;
- says in one line (exit code 2) when the job could not be joined within the start-up timeout (a
  process never started, a wrong coordinator address), which jax.distributed also ends from C++;
- otherwise exits with the child's exit code (128 + N for a signal N, as a shell reports it).
BERTJAX_SUPERVISE=0 runs without it (raw output, e.g. to debug jax.distributed itself).
"""

import os
import re
import signal
import subprocess
import sys
import time

LOST_PEER_EXIT = 75  # EX_TEMPFAIL: a temporary failure; start the job again to resume it
_CHILD = "BERTJAX_SUPERVISED"
# jax.distributed's reports: the coordinator lists the processes whose heartbeats stopped; any other
# process, when the coordinator is gone, fails its RPCs to it.
_UNHEALTHY = re.compile(r"following tasks are unhealthy \(stopped sending heartbeats\):\s*([\d,\s]+)")
# Where such a report begins: a log line of jax.distributed's C++ parts (they log only when a process is in
# trouble), or its final words.
_FATAL = re.compile(r"^[WEF]\d{4} [\d:.]+\s+\d+ (coordination_service|coordination_service_agent|"
                    r"preemption_sync_manager|client)\.(cc|h):\d+\]|"
                    r"Terminating process because the JAX distributed service detected fatal errors")
_COORDINATOR_GONE = re.compile(r"Failed to send RPC to coordination service|Socket closed|Connection refused|"
                               r"failed to connect to all addresses")


# A collective (gloo on the CPU) whose connection to a peer broke: usually that peer died.
_PEER_GONE = re.compile(r"Connection reset by peer|Connection closed by peer|Broken pipe|Socket closed")


def wanted(environ=None) -> bool:
  """Whether this process should run itself under a supervisor: a multi-process job, not yet supervised."""
  env = os.environ if environ is None else environ
  multi = int(env.get("JAX_NUM_PROCESSES", "1") or 1) > 1 or "," in env.get("TPU_WORKER_HOSTNAMES", "")
  return multi and _CHILD not in env and env.get("BERTJAX_SUPERVISE", "1") != "0"


def lost_process(report: str, process_id: int, num_processes: int) -> str | None:
  """Which process a jax.distributed fatal-error report says was lost ("process 1", "processes 1, 3",
  "process 0 (the coordinator)"), or None if it is not such a report."""
  m = _UNHEALTHY.search(report)
  if m:
    ids = sorted({int(i) for i in re.findall(r"\d+", m.group(1))} - {process_id})
    if ids:
      return ("process " if len(ids) == 1 else "processes ") + ", ".join(map(str, ids))
  if process_id != 0 and _COORDINATOR_GONE.search(report):
    return "process 0 (the coordinator)"
  if _FATAL.search(report) and num_processes == 2:
    return f"process {1 - process_id}"
  return None


def last_checkpoint(argv) -> str:
  """" the last complete checkpoint is step N in DIR;" from --workdir in argv (local workdirs), or ""."""
  workdir = next((a.split("=", 1)[1] for a in argv if a.startswith("--workdir=")), None)
  if not workdir or "://" in workdir:
    return ""
  directory = os.path.join(workdir, "checkpoints")
  try:  # orbax names a finished step's directory by the step alone; an unfinished one has a suffix
    steps = [int(d) for d in os.listdir(directory) if d.isdigit()]
  except OSError:
    steps = []
  return f" the last complete checkpoint is step {max(steps)} in {directory};" if steps else " no checkpoint was saved;"


def await_lost_peer_report(error: BaseException, heartbeat_timeout_s: float):
  """In a supervised process, after `error` ended the run: if it is a collective whose connection to a
  peer broke, waits for jax.distributed to declare that peer lost (which ends this process, and the
  supervisor names the peer) rather than printing a traceback that names no process. Bounded: returns
  after twice the heartbeat timeout if no report came, and the caller re-raises."""
  if _CHILD in os.environ and _PEER_GONE.search(str(error)):
    time.sleep(2 * heartbeat_timeout_s + 10)


def _die_with_parent():
  """In the child, before exec: be killed (SIGKILL) when the supervisor dies (Linux prctl)."""
  try:
    import ctypes

    ctypes.CDLL(None).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
  except Exception:
    pass


def supervise(argv) -> int:
  """Runs `argv` (this process's own command line) as the supervised child; returns the exit code."""
  env = os.environ  # launch/ sets JAX_*; a TPU pod slice's workers have TPU_WORKER_ID and TPU_WORKER_HOSTNAMES
  process_id = int(env.get("JAX_PROCESS_ID") or env.get("TPU_WORKER_ID") or 0)
  num_processes = int(env.get("JAX_NUM_PROCESSES") or len(env.get("TPU_WORKER_HOSTNAMES", "").split(",")))
  child = subprocess.Popen(argv, env=dict(os.environ, **{_CHILD: "1"}), stderr=subprocess.PIPE,
                           preexec_fn=_die_with_parent)
  for sig in (signal.SIGTERM, signal.SIGINT):
    signal.signal(sig, lambda signum, frame: child.send_signal(signum))
  held = []  # a fatal jax.distributed report, kept back from stderr
  for raw in child.stderr:
    line = raw.decode("utf-8", "replace")
    if held or _FATAL.search(line):
      held.append(line)
    else:
      sys.stderr.write(line)
      sys.stderr.flush()
  code = child.wait()
  code = 128 - code if code < 0 else code
  report = "".join(held)
  if code != 0 and "CoordinationService/RegisterTask" in report:  # jax.distributed.initialize never completed
    print(f"error: process {process_id} of {num_processes} could not join the job at "
          f"{os.environ.get('JAX_COORDINATOR_ADDRESS', 'the coordinator')} within --config.startup_timeout: start the "
          "same command on every process, with process 0 reachable at that address", file=sys.stderr, flush=True)
    return 2
  lost = lost_process(report, process_id, num_processes) if held else None
  if lost and code != 0:
    print(f"error: lost {lost} of {num_processes}: it stopped (killed, crashed or its host is gone), so process "
          f"{process_id} stopped too;{last_checkpoint(argv)} start the job again (the same command on every "
          "process) to resume", file=sys.stderr, flush=True)
    return LOST_PEER_EXIT
  if held:  # a fatal report that names no lost process: show it as it was
    sys.stderr.write("".join(held))
  return code
