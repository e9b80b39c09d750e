#!/usr/bin/env bash
# The full HPD recipe on CUDA, through the pipeline's own stages: the whole vendored corpus (88k sentences) plus
# WordNet augmentation, teacher encoding on the GPU, PCA to 128 dimensions (uncentered, as the paper), the student
# (all-MiniLM-L6-v2 + Dense(128, tanh)) with bf16 AMP, batch 256, lr 1e-4 with warm-up, 5 epochs (the paper's
# schedule), under DistributedDataParallel over NCCL when more than one GPU is visible (torchrun), then validation
# (STS-B test, SICK-R test, against the teacher and the same-size baseline). Writes bench/results/gpu_distill.json:
# throughput of each GPU phase and the STS table (bench/_gpu_recipe.py).
#
# Needs the project's environment with a CUDA build of torch (e.g. `make venv` on a CUDA host, then
# `pip install torch==2.13.0` from the CUDA index) and the packaged models; PYTHON overrides the interpreter.
# Usage: bash bench/gpu_distill.sh [--quick]
#   --quick: 40k sentences, 1 epoch (a device check in under 10 minutes); results to gpu_distill_quick.json.
#   --smoke: 300 sentences, 3 steps, on the CPU: checks this script's plumbing anywhere (prints, writes no result).
# STORE overrides the store (default var/bench/gpu_distill, removed first); LAYERS=3 trains a 3-layer student.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
HPD=$(dirname "$PY")/hpd
export HPD_STORE=${STORE:-var/bench/gpu_distill} HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
LIMIT=() EPOCHS=5 RESULT=gpu_distill DEVICE=cuda STEPS=()
case "${1:-}" in
  --quick) LIMIT=(--limit 40000) EPOCHS=1 RESULT=gpu_distill_quick ;;
  --smoke) LIMIT=(--limit 300) EPOCHS=1 RESULT=- DEVICE=cpu STEPS=(--max-steps 3) ;;
esac
LAYERS_ARG=()
if [[ -n "${LAYERS:-}" ]]; then LAYERS_ARG=(--student-layers "$LAYERS") RESULT="${RESULT/#gpu/gpu_l$LAYERS}"; fi
DAY=2026-01-01
rm -rf "$HPD_STORE"
GPUS=0
if [[ $DEVICE == cuda ]]; then
  GPUS=$("$PY" -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"; print(torch.cuda.device_count())')
  "$PY" -c 'import torch; print("devices:", [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())])'
fi
declare -A SECONDS_OF
timed() {  # timed NAME COMMAND...: run, and remember its wall seconds
  local name=$1 start=$SECONDS; shift
  "$@" --quiet >/dev/null
  SECONDS_OF[$name]=$((SECONDS - start)); echo "$name: ${SECONDS_OF[$name]} s"
}

timed stage "$HPD" stage-corpus --source data/corpus/sentences.tsv.gz --column sentence --ingest-date $DAY "${LIMIT[@]}"
timed augment "$HPD" augment --ingest-date $DAY --methods wordnet --fraction 1.0
timed encode "$HPD" encode-teacher --ingest-date $DAY --device $DEVICE --dtype bf16 --batch-size 256
timed fit_pca "$HPD" fit-pca --k 128 --mode uncentered
DISTILL=(distill --device $DEVICE --amp bf16 --batch-size 256 --lr 1e-4 --warmup-ratio 0.1 --epochs "$EPOCHS"
         --checkpoint-every 500 --name gpu-recipe "${LAYERS_ARG[@]}" "${STEPS[@]}")
if (( GPUS > 1 )); then
  timed distill "$(dirname "$PY")/torchrun" --standalone --nproc-per-node "$GPUS" --no-python "$HPD" "${DISTILL[@]}"
else
  timed distill "$HPD" "${DISTILL[@]}"
fi
timed validate "$HPD" validate --model-run gpu-recipe --teacher-dtype bf16 --no-promote --max-regression 100
"$PY" -m bench._gpu_recipe --result "$RESULT" --gpus "$GPUS" \
  --seconds "$(for k in "${!SECONDS_OF[@]}"; do printf '%s=%s ' "$k" "${SECONDS_OF[$k]}"; done)"
