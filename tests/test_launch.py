"""Tests for the launchers in launch/: the TPU VM CLI's dry runs and the multi-GPU shell recipe.

Nothing here calls the real gcloud: commands are either printed (--dry_run) or
sent to a fake `gcloud` placed first on PATH.
"""

import importlib.util
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parent.parent
TPU_VM = REPO_ROOT / "launch" / "tpu_vm.py"
GPU_SH = REPO_ROOT / "launch" / "gpu_multinode.sh"

ZONE = "us-central2-b"
REPO_URL = "https://github.com/example/bertjax.git"
SSH = ["gcloud", "compute", "tpus", "tpu-vm", "ssh"]


def _load_tpu_vm():
  """Imports launch/tpu_vm.py as a module (launch/ is not a package)."""
  spec = importlib.util.spec_from_file_location("tpu_vm", TPU_VM)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


tpu_vm = _load_tpu_vm()


def _env(**extra):
  """Returns this process's environment without launcher-relevant variables, plus `extra`.

  SLURM_* and BERTJAX_* are dropped so that the tests mean the same inside a SLURM job.
  """
  env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "BERTJAX_", "JAX_"))}
  env.update(extra)
  return env


def _tpu_vm(*args, env=None, script=TPU_VM):
  """Runs the TPU VM CLI with `args`; returns the CompletedProcess (text mode)."""
  return subprocess.run([sys.executable, str(script), *args], capture_output=True, text=True,
                        env=env or _env(), timeout=60, check=False)


def _common(accelerator_type="v4-8", workdir="gs://my-bucket/bert-base", *extra):
  """Returns the flags of a complete v4 job, as a user would type them."""
  return ["--name=bert-test", f"--zone={ZONE}", f"--accelerator_type={accelerator_type}",
          "--project=my-proj", f"--repo={REPO_URL}", "--ref=v0.1",
          "--config=configs/bert.py:base", f"--workdir={workdir}", *extra]


def _remote(line):
  """Splits a printed ssh line into (argv without --command, the remote shell line)."""
  argv = shlex.split(line)
  assert argv[-1].startswith("--command=")
  return argv[:-1], argv[-1][len("--command="):]


def _assert_one_line_error(result, *fragments):
  """Asserts a user error: exit 2, nothing on stdout, one `error: ...` line naming `fragments`."""
  assert result.returncode == 2, result
  assert result.stdout == ""
  lines = result.stderr.strip().splitlines()
  assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
  assert "Traceback" not in result.stderr
  for fragment in fragments:
    assert fragment in lines[0]


def test_run_dry_run_prints_every_phase_in_order():
  result = _tpu_vm("run", *_common(), "--spot", "--dry_run", "--",
                   "--config.num_train_steps=1000", "--config.learning_rate=1e-4")
  assert result.returncode == 0, result.stderr
  lines = result.stdout.splitlines()
  assert len(lines) == 5

  assert lines[0] == (
      f"gcloud compute tpus tpu-vm create bert-test --zone={ZONE} --accelerator-type=v4-8 "
      "--version=tpu-ubuntu2204-base --project=my-proj --spot")

  argv, setup = _remote(lines[1])
  assert argv == SSH + ["bert-test", f"--zone={ZONE}", "--project=my-proj", "--worker=all"]
  assert f"git clone {REPO_URL} bertjax" in setup
  assert ("commit=$(git rev-parse --verify --quiet 'origin/v0.1^{commit}' "
          "|| git rev-parse --verify --quiet 'v0.1^{commit}')") in setup
  assert 'git checkout --force --detach "$commit"' in setup
  assert setup.endswith("python3 -m pip install -e '.[tpu]'")

  argv, train = _remote(lines[2])
  assert argv == SSH + ["bert-test", f"--zone={ZONE}", "--project=my-proj", "--worker=all"]
  assert ("python3 -m bertjax.train --config=configs/bert.py:base --workdir=gs://my-bucket/bert-base "
          "--config.num_train_steps=1000 --config.learning_rate=1e-4") in train
  assert "setsid nohup sh -c " in train and "> bertjax-train.log 2>&1 < /dev/null &" in train

  argv, logs = _remote(lines[3])
  assert argv == SSH + ["bert-test", f"--zone={ZONE}", "--project=my-proj", "--worker=0"]
  assert 'tail -n 100 -f --pid="$(cat bertjax-train.pid)" bertjax-train.log' in logs

  assert lines[4] == f"gcloud compute tpus tpu-vm delete bert-test --zone={ZONE} --project=my-proj --quiet"


def test_every_line_is_valid_shell_and_the_remote_lines_parse():
  result = _tpu_vm("run", *_common(), "--dry_run", "--", "--config.note=it's a test")
  assert result.returncode == 0, result.stderr
  for line in result.stdout.splitlines():
    argv = shlex.split(line)
    assert shlex.join(argv) == line
    if argv[-1].startswith("--command="):
      check = subprocess.run(["bash", "-n", "-c", argv[-1][len("--command="):]], capture_output=True,
                             text=True, check=False)
      assert check.returncode == 0, check.stderr


def test_keep_omits_delete():
  result = _tpu_vm("run", *_common(), "--keep", "--dry_run")
  assert result.returncode == 0, result.stderr
  verbs = [shlex.split(line)[4] for line in result.stdout.splitlines()]
  assert verbs == ["create", "ssh", "ssh", "ssh"]


@pytest.mark.parametrize("phase, verb, worker", [
    ("create", "create", None),
    ("setup", "ssh", "--worker=all"),
    ("train", "ssh", "--worker=all"),
    ("logs", "ssh", "--worker=0"),
    ("delete", "delete", None),
])
def test_each_phase_alone_prints_one_command(phase, verb, worker):
  result = _tpu_vm(phase, *_common(), "--dry_run")
  assert result.returncode == 0, result.stderr
  (line,) = result.stdout.splitlines()
  argv = shlex.split(line)
  assert argv[:6] == ["gcloud", "compute", "tpus", "tpu-vm", verb, "bert-test"]
  if worker:
    assert worker in argv


def test_delete_needs_only_name_and_zone():
  result = _tpu_vm("delete", "--name=old", f"--zone={ZONE}", "--dry_run")
  assert result.returncode == 0, result.stderr
  assert result.stdout == f"gcloud compute tpus tpu-vm delete old --zone={ZONE} --quiet\n"


@pytest.mark.parametrize("accelerator_type, runtime", [
    ("v4-32", "tpu-ubuntu2204-base"),
    ("v5litepod-16", "v2-alpha-tpuv5-lite"),
    ("v5p-8", "v2-alpha-tpuv5"),
    ("v6e-8", "v2-alpha-tpuv6e"),
])
def test_create_picks_the_runtime_version_of_the_generation(accelerator_type, runtime):
  result = _tpu_vm("create", "--name=n", f"--zone={ZONE}", f"--accelerator_type={accelerator_type}",
                   "--dry_run")
  assert result.returncode == 0, result.stderr
  assert result.stdout == (f"gcloud compute tpus tpu-vm create n --zone={ZONE} "
                           f"--accelerator-type={accelerator_type} --version={runtime}\n")


def test_create_runtime_override_preemptible_and_v5e_alias():
  result = _tpu_vm("create", "--name=n", f"--zone={ZONE}", "--accelerator_type=v5e-16",
                   "--runtime_version=my-runtime", "--preemptible", "--dry_run")
  assert result.returncode == 0, result.stderr
  assert result.stdout == (f"gcloud compute tpus tpu-vm create n --zone={ZONE} "
                           "--accelerator-type=v5litepod-16 --version=my-runtime --preemptible\n")


@pytest.mark.parametrize("accelerator_type, workers", [
    ("v2-8", 1), ("v3-32", 4),
    ("v4-8", 1), ("v4-16", 2), ("v4-32", 4), ("v4-128", 16),
    ("v5p-8", 1), ("v5p-32", 4),
    ("v5litepod-1", 1), ("v5litepod-4", 1), ("v5litepod-8", 1), ("v5litepod-16", 4),
    ("v5e-256", 64),
    ("v6e-1", 1), ("v6e-8", 1), ("v6e-16", 4), ("v6e-256", 64),
])
def test_num_workers(accelerator_type, workers):
  assert tpu_vm.num_workers(accelerator_type) == workers


@pytest.mark.parametrize("accelerator_type", ["v4-12", "v7-8", "v4", "tpu-v4-8", "v6e-18", ""])
def test_num_workers_rejects_impossible_types(accelerator_type):
  with pytest.raises(tpu_vm.UserError):
    tpu_vm.num_workers(accelerator_type)


def test_local_workdir_on_a_pod_slice_is_refused_before_anything_runs():
  result = _tpu_vm("run", *_common("v4-32", "/tmp/bert"), "--dry_run")
  _assert_one_line_error(result, "gs://", "v4-32", "4 workers")


def test_local_workdir_is_refused_without_dry_run_too():
  # Same check on the real path: it fails before gcloud would be looked up.
  result = _tpu_vm("train", *_common("v5litepod-16", "runs/bert"))
  _assert_one_line_error(result, "gs://", "v5litepod-16")


def test_local_workdir_on_one_host_is_allowed_with_a_warning():
  result = _tpu_vm("run", *_common("v4-8", "/tmp/bert"), "--dry_run")
  assert result.returncode == 0, result.stderr
  assert "--workdir=/tmp/bert" in result.stdout
  assert result.stderr.startswith("warning: ")


@pytest.mark.parametrize("args, fragment", [
    (["run", "--name=n"], "--zone"),
    (["run", "--name=n", f"--zone={ZONE}", "--accelerator_type=v9-8"], "v9-8"),
    (["train", "--name=n", f"--zone={ZONE}", "--accelerator_type=v4-8", "--config=c"], "--workdir"),
    (["create", "--name=n", f"--zone={ZONE}"], "--accelerator_type"),
    (["create", "--name=n", f"--zone={ZONE}", "--accelerator_type=v4-8", "--spot", "--preemptible"],
     "--preemptible"),
    (["logs", "--name=n", f"--zone={ZONE}", "--", "--config.x=1"], "bertjax.train"),
    (["launch"], "launch"),
])
def test_user_errors_are_one_line(args, fragment):
  _assert_one_line_error(_tpu_vm(*args, "--dry_run"), fragment)


def _checkout_copy(tmp_path, origin):
  """Copies tpu_vm.py into a fresh git checkout whose origin is `origin` (None: no remote)."""
  (tmp_path / "launch").mkdir()
  shutil.copy(TPU_VM, tmp_path / "launch" / "tpu_vm.py")
  subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
  if origin:
    subprocess.run(["git", "-C", str(tmp_path), "remote", "add", "origin", origin], check=True)
  return tmp_path / "launch" / "tpu_vm.py"


def test_repo_defaults_to_the_origin_remote(tmp_path):
  script = _checkout_copy(tmp_path, "https://example.com/team/bertjax.git")
  result = _tpu_vm("setup", "--name=n", f"--zone={ZONE}", "--dry_run", script=script)
  assert result.returncode == 0, result.stderr
  assert "git clone https://example.com/team/bertjax.git bertjax" in result.stdout
  assert "origin/main^{commit}" in result.stdout


def test_repo_is_required_without_an_origin_remote(tmp_path):
  script = _checkout_copy(tmp_path, None)
  _assert_one_line_error(_tpu_vm("setup", "--name=n", f"--zone={ZONE}", "--dry_run", script=script),
                         "--repo")


def test_a_local_path_origin_is_refused(tmp_path):
  script = _checkout_copy(tmp_path, "/srv/git/bertjax.git")
  _assert_one_line_error(_tpu_vm("setup", "--name=n", f"--zone={ZONE}", "--dry_run", script=script),
                         "/srv/git/bertjax.git", "--repo")


# A stand-in for gcloud: logs which phase called it, exits with $FAKE_EXIT_<phase> (default 0).
_FAKE_GCLOUD = r"""#!/bin/sh
case "$*" in
  *--worker=0*) phase=logs ;;
  *"pip install"*) phase=setup ;;
  *"-m bertjax.train"*) phase=train ;;
  *) phase="$4" ;;
esac
echo "$phase" >> "$FAKE_LOG"
eval "code=\${FAKE_EXIT_$phase:-0}"
exit "$code"
"""


def _run_with_fake_gcloud(tmp_path, *args, **exit_codes):
  """Runs the CLI for real against a fake gcloud; returns (CompletedProcess, phases called)."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir()
  fake = bin_dir / "gcloud"
  fake.write_text(_FAKE_GCLOUD)
  fake.chmod(0o755)
  log = tmp_path / "calls"
  env = _env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", FAKE_LOG=str(log),
             **{f"FAKE_EXIT_{phase}": str(code) for phase, code in exit_codes.items()})
  assert shutil.which("gcloud", path=env["PATH"]) == str(fake)
  result = _tpu_vm(*args, env=env)
  return result, log.read_text().split() if log.exists() else []


def test_run_executes_all_phases_and_echoes_them(tmp_path):
  result, calls = _run_with_fake_gcloud(tmp_path, "run", *_common())
  assert result.returncode == 0, result.stderr
  assert calls == ["create", "setup", "train", "logs", "delete"]
  assert result.stderr.count("\n+ gcloud ") + result.stderr.startswith("+ gcloud ") == 5


def test_a_failed_create_returns_its_exit_code_and_deletes_nothing(tmp_path):
  result, calls = _run_with_fake_gcloud(tmp_path, "run", *_common(), create=3)
  assert result.returncode == 3
  assert calls == ["create"]


def test_a_failed_setup_still_deletes_the_vm_unless_keep(tmp_path):
  result, calls = _run_with_fake_gcloud(tmp_path, "run", *_common(), setup=7)
  assert result.returncode == 7
  assert calls == ["create", "setup", "delete"]
  assert "error: setup failed (exit 7)" in result.stderr


def test_a_failed_setup_with_keep_leaves_the_vm(tmp_path):
  result, calls = _run_with_fake_gcloud(tmp_path, "run", *_common(), "--keep", setup=7)
  assert result.returncode == 7
  assert calls == ["create", "setup"]


def test_a_lost_log_connection_does_not_delete_a_running_job(tmp_path):
  result, calls = _run_with_fake_gcloud(tmp_path, "run", *_common(), logs=255)
  assert result.returncode == 255
  assert calls == ["create", "setup", "train", "logs"]
  assert "training may still be running" in result.stderr


def test_a_single_phase_returns_the_gcloud_exit_code(tmp_path):
  result, calls = _run_with_fake_gcloud(tmp_path, "delete", "--name=n", f"--zone={ZONE}", delete=4)
  assert result.returncode == 4
  assert calls == ["delete"]


@pytest.mark.skipif(not (shutil.which("setsid") and shutil.which("git")), reason="needs setsid and git")
def test_remote_lines_work_on_a_simulated_worker(tmp_path):
  """Runs the setup, train and logs lines in a local shell standing in for a worker."""
  upstream = tmp_path / "upstream"
  git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.com", "-C", str(upstream)]
  subprocess.run(["git", "init", "-q", "-b", "main", str(upstream)], check=True)
  subprocess.run(git + ["commit", "-q", "--allow-empty", "-m", "init"], check=True)
  subprocess.run(git + ["tag", "v0.1"], check=True)
  home = tmp_path / "home"
  home.mkdir()
  python = tmp_path / "python3"  # Records its arguments; pip succeeds, "training" fails with exit 3.
  python.write_text('#!/bin/sh\necho "args: $*"; echo "cwd: $(pwd)"\n'
                    '[ "$2" = pip ] && exit 0; sleep 0.3; exit 3\n')
  python.chmod(0o755)

  def worker(line):
    return subprocess.run(["bash", "-c", line], cwd=home, env=_env(HOME=str(home)), capture_output=True,
                          text=True, timeout=30, check=False)

  setup = worker(tpu_vm.setup_script(repo=str(upstream), ref="v0.1", python=str(python)))
  assert setup.returncode == 0, setup.stderr
  assert "args: -m pip install -e .[tpu]" in setup.stdout
  assert worker(tpu_vm.setup_script(repo=str(upstream), ref="main", python=str(python))).returncode == 0
  missing = worker(tpu_vm.setup_script(repo=str(upstream), ref="nope", python=str(python)))
  assert missing.returncode == 1 and "error: no branch, tag or commit 'nope'" in missing.stderr

  script = tpu_vm.train_script(python=str(python), config="configs/bert.py:base", workdir="gs://b/w",
                               overrides=["--config.note=it's a test"])
  assert worker(script).returncode == 0  # Returns at once: the job runs detached.
  again = worker(script)
  assert again.returncode == 1 and "already running" in again.stderr

  logs = worker(tpu_vm.logs_script())
  assert logs.returncode == 3  # The job's own exit code, once it is over.
  assert "args: -m bertjax.train --config=configs/bert.py:base --workdir=gs://b/w --config.note=it's a test" in logs.stdout
  assert f"cwd: {home / 'bertjax'}" in logs.stdout


def test_gpu_script_is_valid_bash():
  assert subprocess.run(["bash", "-n", str(GPU_SH)], check=False).returncode == 0


def _gpu(tmp_path, *args, **env):
  """Runs gpu_multinode.sh with a fake `scontrol` on PATH that expands to node001..node004."""
  bin_dir = tmp_path / "bin"
  bin_dir.mkdir(exist_ok=True)
  scontrol = bin_dir / "scontrol"
  scontrol.write_text("#!/bin/sh\nprintf 'node001\\nnode002\\nnode003\\nnode004\\n'\n")
  scontrol.chmod(0o755)
  return subprocess.run(["bash", str(GPU_SH), *args], capture_output=True, text=True, timeout=30,
                        env=_env(PATH=f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **env), check=False)


def test_gpu_dry_run_under_slurm(tmp_path):
  result = _gpu(tmp_path, "--dry-run", "--config=configs/bert.py:base", "--workdir=/shared/runs/a b",
                SLURM_NTASKS="4", SLURM_PROCID="2", SLURM_JOB_NODELIST="node[001-004]")
  assert result.returncode == 0, result.stderr
  assert result.stdout.splitlines() == [
      "JAX_COORDINATOR_ADDRESS=node001:12355",
      "JAX_NUM_PROCESSES=4",
      "JAX_PROCESS_ID=2",
      r"python -m bertjax.train --config=configs/bert.py:base --workdir=/shared/runs/a\ b",
  ]


def test_gpu_dry_run_with_explicit_values(tmp_path):
  result = _gpu(tmp_path, "--dry-run", "--config=configs/bert.py:tiny", BERTJAX_COORDINATOR="10.0.0.1:9999",
                BERTJAX_NUM_PROCESSES="2", BERTJAX_PROCESS_ID="1", PYTHON="python3.11")
  assert result.returncode == 0, result.stderr
  assert result.stdout.splitlines() == [
      "JAX_COORDINATOR_ADDRESS=10.0.0.1:9999",
      "JAX_NUM_PROCESSES=2",
      "JAX_PROCESS_ID=1",
      "python3.11 -m bertjax.train --config=configs/bert.py:tiny",
  ]


@pytest.mark.parametrize("env, fragment", [
    ({}, "BERTJAX_COORDINATOR"),
    ({"BERTJAX_COORDINATOR": "h", "BERTJAX_NUM_PROCESSES": "2", "BERTJAX_PROCESS_ID": "2"}, "not below"),
    ({"BERTJAX_COORDINATOR": "h", "BERTJAX_NUM_PROCESSES": "two", "BERTJAX_PROCESS_ID": "0"}, "integer"),
])
def test_gpu_script_refuses_incomplete_settings(tmp_path, env, fragment):
  result = _gpu(tmp_path, "--dry-run", **env)
  assert result.returncode == 2
  assert result.stdout == ""
  assert result.stderr.startswith("error: ") and fragment in result.stderr
