#!/usr/bin/env bash
# bertjax vs transformers on one NVIDIA GPU at equal work (benchmarks/accelerator.py; its flags pass through):
#   benchmarks/accelerator.sh --out=/tmp/accel.json
# Runs from the checkout without installing bertjax (the repository root goes on PYTHONPATH).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
export PYTHONPATH="${root}${PYTHONPATH:+:${PYTHONPATH}}"
exec "${PYTHON:-python3}" "${root}/benchmarks/accelerator.py" "$@"
