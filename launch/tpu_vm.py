#!/usr/bin/env python3
"""Runs a bertjax pretraining job on a Cloud TPU VM: create, set up, train, tail the logs, delete.

Usage:
  python launch/tpu_vm.py {create,setup,train,logs,delete,run} --name=NAME --zone=ZONE [options]
      [-- --config.KEY=VALUE ...]

Every phase takes the same flags and uses those it needs, so one command line can
be replayed phase by phase by changing only the subcommand. `run` does all five.
With --dry_run every gcloud command is printed, one per line, and nothing runs.

This file is deliberately standalone (no bertjax or jax import): it runs on a
laptop that has only gcloud and Python.
"""

import argparse
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

# Paths on each worker, relative to the ssh login directory (the user's home).
REMOTE_DIR = "bertjax"
LOG_FILE = "bertjax-train.log"
PID_FILE = "bertjax-train.pid"
EXIT_FILE = "bertjax-train.exitcode"

PHASES = ("create", "setup", "train", "logs", "delete")

# ssh exits 255 when the connection itself fails, as opposed to the remote command.
SSH_CONNECTION_FAILED = 255

_DEFAULT_RUNTIME_VERSION = {
    "v2": "tpu-ubuntu2204-base",
    "v3": "tpu-ubuntu2204-base",
    "v4": "tpu-ubuntu2204-base",
    "v5litepod": "v2-alpha-tpuv5-lite",
    "v5p": "v2-alpha-tpuv5",
    "v6e": "v2-alpha-tpuv6e",
}
_ACCELERATOR_RE = re.compile(r"^(v2|v3|v4|v5p|v5litepod|v5e|v6e)-([1-9][0-9]*)$")
# Generations whose type suffix counts TensorCores (two per chip); the others count chips.
_COUNTS_TENSORCORES = ("v2", "v3", "v4", "v5p")


class UserError(Exception):
  """A problem the user can fix; main() prints it as one `error: ...` line and exits 2.

  Not bertjax.core.errors.UserError: importing the package would tie this launcher to
  an installed bertjax, and it has to run where only gcloud is installed.
  """


class _Parser(argparse.ArgumentParser):
  """An ArgumentParser whose usage errors are one `error: ...` line, like UserError."""

  def error(self, message):
    raise UserError(f"{message} (see --help)")


def parse_accelerator_type(accelerator_type):
  """Splits an accelerator type like 'v4-32' into ('v4', 32).

  The v5e alias 'v5e-N' is returned as 'v5litepod', the name the TPU API uses.

  Raises:
    UserError: the type is not GENERATION-N for a known generation.
  """
  match = _ACCELERATOR_RE.match(accelerator_type or "")
  if not match:
    raise UserError(
        f"unknown --accelerator_type={accelerator_type!r}; expected e.g. v4-8, v4-32, "
        "v5litepod-16, v5p-8, v6e-8")
  generation, size = match.group(1), int(match.group(2))
  return ("v5litepod" if generation == "v5e" else generation), size


def num_workers(accelerator_type):
  """Returns how many hosts (TPU VM workers) a slice of `accelerator_type` has.

  | Type                    | N counts                 | Workers                 | Examples                       |
  |-------------------------|--------------------------|-------------------------|--------------------------------|
  | v2-N v3-N v4-N v5p-N    | TensorCores (8 per host) | N / 8                   | v4-8: 1, v4-32: 4, v5p-128: 16 |
  | v5litepod-N v5e-N v6e-N | chips                    | 1 if N <= 8, else N / 4 | v5litepod-16: 4, v6e-256: 64   |

  v5e and v6e single-host slices (1, 4 or 8 chips) sit on one VM, but multi-host
  slices are built from 4-chip VMs, hence N / 4 rather than N / 8 above 8 chips.

  Raises:
    UserError: unknown generation, or a size that no slice has.
  """
  generation, size = parse_accelerator_type(accelerator_type)
  if generation in _COUNTS_TENSORCORES:
    if size % 8:
      raise UserError(f"--accelerator_type={accelerator_type}: {generation} sizes are multiples of 8")
    return size // 8
  if size <= 8:
    return 1
  if size % 4:
    raise UserError(f"--accelerator_type={accelerator_type}: multi-host {generation} sizes are multiples of 4")
  return size // 4


def default_runtime_version(accelerator_type):
  """Returns the TPU VM software version to use for `accelerator_type`'s generation."""
  generation, _ = parse_accelerator_type(accelerator_type)
  return _DEFAULT_RUNTIME_VERSION[generation]


def api_accelerator_type(accelerator_type):
  """Returns the name the TPU API accepts, e.g. 'v5e-16' -> 'v5litepod-16'."""
  generation, size = parse_accelerator_type(accelerator_type)
  return f"{generation}-{size}"


def _location_flags(zone, project):
  """Returns the flags that place a gcloud TPU command: zone, and project if given."""
  return [f"--zone={zone}"] + ([f"--project={project}"] if project else [])


def create_command(*, name, zone, project, accelerator_type, runtime_version, spot, preemptible):
  """Returns the gcloud argv that creates the TPU VM (it blocks until the VM is READY)."""
  argv = ["gcloud", "compute", "tpus", "tpu-vm", "create", name, f"--zone={zone}",
          f"--accelerator-type={api_accelerator_type(accelerator_type)}",
          f"--version={runtime_version}"]
  argv += [f"--project={project}"] if project else []
  argv += ["--spot"] if spot else []
  argv += ["--preemptible"] if preemptible else []
  return argv


def ssh_command(*, name, zone, project, worker, remote_command):
  """Returns the gcloud argv that runs `remote_command` (one shell line) on `worker` ('all' or an index)."""
  return ["gcloud", "compute", "tpus", "tpu-vm", "ssh", name, *_location_flags(zone, project),
          f"--worker={worker}", f"--command={remote_command}"]


def delete_command(*, name, zone, project):
  """Returns the gcloud argv that deletes the TPU VM without prompting."""
  return ["gcloud", "compute", "tpus", "tpu-vm", "delete", name, *_location_flags(zone, project),
          "--quiet"]


def setup_script(*, repo, ref, python):
  """Returns the worker shell line that clones (or updates) the repo at `ref` and installs it for TPU.

  It is idempotent, so `setup` can be rerun after pushing a fix.
  """
  q = shlex.quote
  return "; ".join([
      "set -e",
      f"[ -d {REMOTE_DIR}/.git ] || git clone {q(repo)} {REMOTE_DIR}",
      f"cd {REMOTE_DIR}",
      # An earlier setup may have cloned another --repo (e.g. a fork) into the same place.
      f"git remote set-url origin {q(repo)}",
      "git fetch --tags --force origin",
      # A branch must resolve to the just-fetched origin/<ref>, not to a stale local
      # branch from an earlier setup; tags and commit ids resolve as themselves.
      f"commit=$(git rev-parse --verify --quiet {q('origin/' + ref + '^{commit}')}"
      f" || git rev-parse --verify --quiet {q(ref + '^{commit}')})"
      f" || {{ echo {q(f'error: no branch, tag or commit {ref!r} in {repo}')} >&2; exit 1; }}",
      'git checkout --force --detach "$commit"',
      f"{q(python)} -m pip install -e '.[tpu]'",
  ])


def train_script(*, python, config, workdir, overrides):
  """Returns the worker shell line that starts training in the background and returns at once.

  setsid + nohup detach the job from the ssh session so that it survives the
  disconnect; all three standard streams are redirected, otherwise ssh would wait
  for them to close. The PID file lets `logs` follow the job until it ends and
  refuses a second job on a busy TPU; the exit-code file outlives the process.
  """
  train = shlex.join([python, "-m", "bertjax.train", f"--config={config}", f"--workdir={workdir}",
                      *overrides])
  job = f"cd {REMOTE_DIR} && {train}; echo $? > ~/{EXIT_FILE}"
  return "; ".join([
      f'if [ -f {PID_FILE} ] && kill -0 "$(cat {PID_FILE})" 2>/dev/null; then'
      f' echo "error: bertjax.train is already running on $(hostname)" >&2; exit 1; fi',
      f"rm -f {EXIT_FILE}",
      f"setsid nohup sh -c {shlex.quote(job)} > {LOG_FILE} 2>&1 < /dev/null & echo $! > {PID_FILE}",
  ])


def logs_script(lines=100):
  """Returns the worker shell line that follows the training log until the job ends.

  It then exits with the job's exit code, so `run` knows that training finished
  (and how) before it deletes the VM.
  """
  return "; ".join([
      f'if [ ! -f {LOG_FILE} ]; then echo "error: no {LOG_FILE} on $(hostname); run the train phase first" >&2;'
      " exit 1; fi",
      f'tail -n {lines} -f --pid="$(cat {PID_FILE})" {LOG_FILE}',
      f'if [ -f {EXIT_FILE} ]; then exit "$(cat {EXIT_FILE})"; fi',
  ])


def default_repo_url(repo_root):
  """Returns the `origin` remote URL of the git checkout at `repo_root`, or None if it has none."""
  try:
    result = subprocess.run(["git", "-C", str(repo_root), "remote", "get-url", "origin"],
                            capture_output=True, text=True, check=False)
  except FileNotFoundError:  # No git on this machine: same as no remote.
    return None
  url = result.stdout.strip()
  return url if result.returncode == 0 and url else None


def _is_local_path(url):
  """Tells whether a git URL names a path on this machine, which the workers cannot clone."""
  return url.startswith(("/", ".", "~", "file:")) or ":" not in url


def split_overrides(argv):
  """Splits argv at the first '--' into (launcher flags, flags passed through to bertjax.train)."""
  if "--" in argv:
    i = argv.index("--")
    return argv[:i], argv[i + 1:]
  return argv, []


def build_parser():
  """Returns the argument parser: one subcommand per phase plus `run`, all sharing every flag."""
  common = _Parser(add_help=False)
  common.add_argument("--name", required=True, help="TPU VM name.")
  common.add_argument("--zone", required=True, help="e.g. us-central2-b (v4), us-west4-a (v5e).")
  common.add_argument("--project", help="GCP project; default: gcloud's configured project.")
  common.add_argument("--accelerator_type", help="e.g. v4-8, v4-32, v5litepod-16, v5p-8, v6e-8.")
  common.add_argument("--runtime_version",
                      help="TPU VM software version; default by generation: v2/v3/v4 "
                      "tpu-ubuntu2204-base, v5e v2-alpha-tpuv5-lite, v5p v2-alpha-tpuv5, "
                      "v6e v2-alpha-tpuv6e.")
  capacity = common.add_mutually_exclusive_group()
  capacity.add_argument("--spot", action="store_true", help="Create a Spot VM (cheaper, preemptible).")
  capacity.add_argument("--preemptible", action="store_true", help="Create a legacy preemptible VM.")
  common.add_argument("--repo", help="git URL the workers clone; default: this checkout's origin remote.")
  common.add_argument("--ref", default="main", help="Branch, tag or commit to check out (default: main).")
  common.add_argument("--python", default="python3", help="Python interpreter on the workers.")
  common.add_argument("--config", help="e.g. configs/bert.py:base (relative to the repo root).")
  common.add_argument("--workdir", help="Checkpoints and logs; must be gs://... on multi-host slices.")
  common.add_argument("--keep", action="store_true", help="run: do not delete the VM at the end.")
  common.add_argument("--dry_run", action="store_true", help="Print every command and run none.")

  parser = _Parser(
      description="Run bertjax on a Cloud TPU VM. Flags after `--` (e.g. --config.KEY=VALUE) "
      "are passed to bertjax.train.")
  subparsers = parser.add_subparsers(dest="phase", required=True, metavar="{create,setup,train,logs,delete,run}")
  helps = {
      "create": "Create the TPU VM.",
      "setup": "Clone --repo at --ref and pip install the tpu extra on every worker.",
      "train": "Start bertjax.train on every worker in the background.",
      "logs": "Follow worker 0's training log until the job ends.",
      "delete": "Delete the TPU VM.",
      "run": "create, setup, train and logs in order, then delete the VM unless --keep.",
  }
  for phase, text in helps.items():
    subparsers.add_parser(phase, parents=[common], help=text, description=text)
  return parser


def validate(args, phases, overrides, repo_root):
  """Checks that the flags needed by `phases` are there and consistent, before anything runs.

  Returns:
    The git URL the workers clone (None when no setup phase runs).

  Raises:
    UserError: a missing or inconsistent flag.
  """
  def require(flag):
    if not getattr(args, flag):
      raise UserError(f"--{flag} is required for {args.phase}")

  if overrides and "train" not in phases:
    raise UserError(f"flags after -- go to bertjax.train; {args.phase} does not start training")
  if "create" in phases or "train" in phases:
    require("accelerator_type")
    num_workers(args.accelerator_type)  # Rejects unknown types early.
  repo = None
  if "setup" in phases:
    repo = args.repo or default_repo_url(repo_root)
    if not repo:
      raise UserError(f"--repo is required: {repo_root} has no origin remote to default to")
    if _is_local_path(repo):
      raise UserError(f"repo {repo!r} is a local path the TPU workers cannot clone; pass --repo=URL")
  if "train" in phases:
    require("config")
    require("workdir")
    workers = num_workers(args.accelerator_type)
    if not args.workdir.startswith("gs://"):
      if workers > 1:
        raise UserError(
            f"--workdir must be a gs:// path on {args.accelerator_type} ({workers} workers): "
            f"checkpoints need storage shared by all workers; got {args.workdir!r}")
      if args.phase == "run" and not args.keep:
        print(f"warning: --workdir={args.workdir} is on the VM's disk and is deleted with the VM; "
              "use gs:// or --keep", file=sys.stderr)
  return repo


def plan(args, phases, overrides, repo):
  """Returns [(phase, argv)] for `phases`, in order; pure given validated arguments."""
  where = dict(name=args.name, zone=args.zone, project=args.project)
  builders = {
      "create": lambda: create_command(
          **where, accelerator_type=args.accelerator_type,
          runtime_version=args.runtime_version or default_runtime_version(args.accelerator_type),
          spot=args.spot, preemptible=args.preemptible),
      "setup": lambda: ssh_command(**where, worker="all", remote_command=setup_script(
          repo=repo, ref=args.ref, python=args.python)),
      "train": lambda: ssh_command(**where, worker="all", remote_command=train_script(
          python=args.python, config=args.config, workdir=args.workdir, overrides=overrides)),
      "logs": lambda: ssh_command(**where, worker=0, remote_command=logs_script()),
      "delete": lambda: delete_command(**where),
  }
  return [(phase, builders[phase]()) for phase in phases]


def run_command(argv):
  """Runs one command with the terminal attached, echoing it to stderr first; returns its exit code."""
  print(f"+ {shlex.join(argv)}", file=sys.stderr, flush=True)
  return subprocess.run(argv, check=False).returncode


def execute(steps, *, cleanup=None, dry_run=False):
  """Prints (dry run) or runs `steps`, then `cleanup`; returns the first nonzero exit code, else 0.

  `cleanup` (the `run` phase's delete) also runs after a failed setup, train or
  logs step, so that a failure does not leave a billed VM behind. It does not run
  when create failed (the name may belong to an existing VM), nor when the log
  ssh lost its connection (training may still be running).
  """
  if dry_run:
    for _, argv in steps + ([("delete", cleanup)] if cleanup else []):
      print(shlex.join(argv))
    return 0
  if shutil.which("gcloud") is None:
    raise UserError("gcloud not found on PATH; install the Google Cloud SDK")
  for phase, argv in steps:
    code = run_command(argv)
    if code == 0:
      continue
    if cleanup is None or phase == "create":
      return code
    if phase == "logs" and code == SSH_CONNECTION_FAILED:
      print("error: lost the ssh connection to worker 0; training may still be running. "
            f"Reattach with `logs`, or delete with: {shlex.join(cleanup)}", file=sys.stderr)
      return code
    print(f"error: {phase} failed (exit {code}); deleting the VM (pass --keep to keep it)", file=sys.stderr)
    run_command(cleanup)
    return code
  return run_command(cleanup) if cleanup else 0


def main(argv):
  """Parses `argv`, then prints or runs the commands of the chosen phase(s); returns the exit code."""
  own, overrides = split_overrides(argv)
  args = build_parser().parse_args(own)
  is_run = args.phase == "run"
  # `run`'s delete is not a plain step: it is cleanup that also follows failures.
  phases = [phase for phase in PHASES if phase != "delete"] if is_run else [args.phase]
  repo_root = Path(__file__).resolve().parent.parent
  repo = validate(args, phases, overrides, repo_root)
  steps = plan(args, phases, overrides, repo)
  cleanup = None if not is_run or args.keep else delete_command(
      name=args.name, zone=args.zone, project=args.project)
  try:
    return execute(steps, cleanup=cleanup, dry_run=args.dry_run)
  except KeyboardInterrupt:
    # Ctrl-C usually means "stop watching", not "destroy the job": never delete here.
    delete = shlex.join(delete_command(name=args.name, zone=args.zone, project=args.project))
    print(f"\ninterrupted; the VM {args.name} (if created) keeps running; delete it with: {delete}",
          file=sys.stderr)
    return 130


if __name__ == "__main__":
  try:
    sys.exit(main(sys.argv[1:]))
  except UserError as e:
    print(f"error: {e}", file=sys.stderr)
    sys.exit(2)
