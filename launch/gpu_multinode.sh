#!/usr/bin/env bash
# Starts one bertjax training process on this host, wired up for multi-GPU / multi-node JAX.
#
# Run it once per host (not once per GPU): each process drives all the GPUs it
# can see, and jax.distributed connects the processes. It exports
#
#   JAX_COORDINATOR_ADDRESS  host:port of process 0, which every process dials
#   JAX_NUM_PROCESSES        how many processes (hosts) take part
#   JAX_PROCESS_ID           this process's rank, 0 .. JAX_NUM_PROCESSES - 1
#
# which bertjax.train passes to jax.distributed.initialize(), then execs
# `python -m bertjax.train "$@"`.
#
# Where the values come from:
#   * Under SLURM (SLURM_NTASKS and SLURM_PROCID set, i.e. inside `srun`):
#     SLURM_NTASKS, SLURM_PROCID, and the first host of SLURM_JOB_NODELIST
#     (expanded with `scontrol show hostnames`). BERTJAX_COORDINATOR, if set,
#     replaces that first host (e.g. to pick a specific network interface).
#   * Otherwise, from BERTJAX_COORDINATOR (host or host:port),
#     BERTJAX_NUM_PROCESSES and BERTJAX_PROCESS_ID, which must all be set.
#   The port is BERTJAX_COORDINATOR_PORT (default 12355) unless the coordinator
#   value already has one. PYTHON picks the interpreter (default: python).
#
# Usage:
#   srun --nodes=4 --ntasks-per-node=1 launch/gpu_multinode.sh \
#       --config=configs/bert.py:base --workdir=/shared/runs/bert-base
#   BERTJAX_COORDINATOR=10.0.0.1 BERTJAX_NUM_PROCESSES=2 BERTJAX_PROCESS_ID=0 \
#       launch/gpu_multinode.sh --config=configs/bert.py:base --workdir=/shared/runs/bert-base
#
# With --dry-run as the first argument it prints the environment and the
# command instead of running them.
#
# Local mode, `--local N` as the first arguments: starts N processes on this
# machine, each this script again with the variables a cluster would give it
# (BERTJAX_COORDINATOR=127.0.0.1:PORT, BERTJAX_NUM_PROCESSES=N,
# BERTJAX_PROCESS_ID=i), so the recipe a cluster runs is the one tested here.
# Each process gets this environment, so on a CPU
#   XLA_FLAGS=--xla_force_host_platform_device_count=4 launch/gpu_multinode.sh --local 2 \
#       --config=configs/bert.py:tiny --workdir=/tmp/bert-2proc
# runs 2 processes of 4 CPU devices each (8 in all), their collectives over gloo.
# It prints each process's pid, forwards SIGTERM and SIGINT to all of them,
# waits for all, and exits with the first nonzero exit code (0 if none).

set -euo pipefail

die() {
  echo "error: $*" >&2
  exit 2
}

dry_run=0
if [[ "${1:-}" == "--dry-run" ]]; then
  dry_run=1
  shift
fi

port="${BERTJAX_COORDINATOR_PORT:-12355}"

if [[ "${1:-}" == "--local" ]]; then
  n="${2:-}"
  [[ "${n}" =~ ^[1-9][0-9]*$ ]] || die "--local takes the number of processes, got '${n}'"
  shift 2
  pids=()
  for ((i = 0; i < n; i++)); do
    # As a cluster would: explicit coordinator variables, and no SLURM ones to take precedence.
    env -u SLURM_NTASKS -u SLURM_PROCID BERTJAX_COORDINATOR="127.0.0.1:${port}" BERTJAX_NUM_PROCESSES="${n}" \
      BERTJAX_PROCESS_ID="${i}" "$0" $( ((dry_run)) && echo --dry-run) "$@" &
    pids+=($!)
    echo "launch: process ${i} of ${n}: pid $!" >&2
  done
  trap 'kill -TERM "${pids[@]}" 2>/dev/null || true' TERM
  trap 'kill -INT "${pids[@]}" 2>/dev/null || true' INT
  status=0
  for ((i = 0; i < n; i++)); do
    rc=0
    wait "${pids[i]}" || rc=$?
    # A trapped signal (forwarded above) makes `wait` return early, above 128, while the process runs on.
    while ((rc > 128)) && kill -0 "${pids[i]}" 2>/dev/null; do
      rc=0
      wait "${pids[i]}" || rc=$?
    done
    if ((rc > 128)); then  # it ended meanwhile: bash kept its status (127 if bash has none)
      again=0
      wait "${pids[i]}" 2>/dev/null || again=$?
      ((again == 127)) || rc="${again}"
    fi
    if ((rc != 0)); then
      echo "launch: process ${i} exited with ${rc}" >&2
      ((status != 0)) || status="${rc}"
    fi
  done
  exit "${status}"
fi

if [[ -n "${SLURM_NTASKS:-}" && -n "${SLURM_PROCID:-}" ]]; then
  num_processes="${SLURM_NTASKS}"
  process_id="${SLURM_PROCID}"
  coordinator="${BERTJAX_COORDINATOR:-}"
  if [[ -z "${coordinator}" ]]; then
    nodelist="${SLURM_JOB_NODELIST:-${SLURM_NODELIST:-}}"
    [[ -n "${nodelist}" ]] || die "SLURM_JOB_NODELIST is not set; set BERTJAX_COORDINATOR=host"
    command -v scontrol >/dev/null || die "scontrol not found; set BERTJAX_COORDINATOR=host"
    # Every task computes the same first host, so all agree on the coordinator
    # without talking to each other. The whole list is read (no `| head`) so that
    # pipefail cannot trip on scontrol's SIGPIPE with long node lists.
    hosts="$(scontrol show hostnames "${nodelist}")"
    coordinator="${hosts%%$'\n'*}"
    [[ -n "${coordinator}" ]] || die "scontrol found no host in '${nodelist}'; set BERTJAX_COORDINATOR=host"
  fi
else
  coordinator="${BERTJAX_COORDINATOR:-}"
  num_processes="${BERTJAX_NUM_PROCESSES:-}"
  process_id="${BERTJAX_PROCESS_ID:-}"
  [[ -n "${coordinator}" && -n "${num_processes}" && -n "${process_id}" ]] ||
    die "not under SLURM: set BERTJAX_COORDINATOR, BERTJAX_NUM_PROCESSES and BERTJAX_PROCESS_ID"
fi

[[ "${num_processes}" =~ ^[1-9][0-9]*$ ]] || die "number of processes must be a positive integer, got '${num_processes}'"
[[ "${process_id}" =~ ^[0-9]+$ ]] || die "process id must be a non-negative integer, got '${process_id}'"
((process_id < num_processes)) || die "process id ${process_id} is not below the number of processes ${num_processes}"
if [[ "${coordinator}" != *:* ]]; then
  coordinator="${coordinator}:${port}"
fi

export JAX_COORDINATOR_ADDRESS="${coordinator}"
export JAX_NUM_PROCESSES="${num_processes}"
export JAX_PROCESS_ID="${process_id}"

command=("${PYTHON:-python}" -m bertjax.train "$@")

if ((dry_run)); then
  echo "JAX_COORDINATOR_ADDRESS=${JAX_COORDINATOR_ADDRESS}"
  echo "JAX_NUM_PROCESSES=${JAX_NUM_PROCESSES}"
  echo "JAX_PROCESS_ID=${JAX_PROCESS_ID}"
  printf '%q' "${command[0]}"
  printf ' %q' "${command[@]:1}"
  echo
  exit 0
fi

# exec, so that SIGTERM from the scheduler (preemption, time limit) reaches
# bertjax.train directly and it can save a checkpoint.
exec "${command[@]}"
