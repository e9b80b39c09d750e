#!/usr/bin/env bash
# GPU check of the distillation stage: a short HPD run with AMP on one CUDA device, in under 10 minutes.
# Prints the device, training throughput, final training loss, best validation MSE and STS-B test.
#
# Needs the project's environment with a CUDA build of torch (e.g. `make venv` on a CUDA host, then
# `pip install torch==2.13.0` from the CUDA index) and the packaged models; PYTHON overrides the interpreter.
# Usage: bash bench/gpu_distill.sh            (store: var/gpu-check, removed first)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
export HPD_STORE=${STORE:-var/gpu-check} HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
rm -rf "$HPD_STORE"
hpd() { "$PY" -m tasks.cli "$@" --quiet; }

"$PY" -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"; print("device:", torch.cuda.get_device_name())'
start=$(date +%s)
hpd stage-corpus --source data/corpus/sentences.tsv.gz --column sentence --ingest-date 2026-01-01 --limit 40000 >/dev/null
hpd encode-teacher --ingest-date 2026-01-01 --device cuda --dtype fp16 --batch-size 256 >/dev/null
hpd fit-pca --k 128 --max-rows 40000 >/dev/null
echo "teacher encoding + PCA: $(( $(date +%s) - start )) s"
hpd distill --device cuda --amp bf16 --batch-size 256 --lr 1e-4 --epochs 5 --eval-every 50 --checkpoint-every 500 \
    --name gpu-check >/dev/null
"$PY" - <<'PY'
import json, os
from tasks.core import manifest, storage
from tasks.core.catalog import Stage
from tasks.ml import sts, student
from tasks.ml.encoder import SentenceEncoder
import tempfile, pathlib

store = storage.to_uri(os.environ["HPD_STORE"])
published = manifest.read(store, Stage.DISTILL, "gpu-check")
stats, seconds = published.stats, published.document["timings_s"]["train"]
model_prefix = student.exported_prefix(store, "gpu-check")
losses = storage.read_bytes(model_prefix.removesuffix("/model") + "/losses.jsonl").decode().splitlines()
print(f"steps: {stats['steps']}, throughput: {stats['steps'] * 256 / seconds:.0f} sentences/s (train phase {seconds:.0f} s)")
print(f"final training loss: {json.loads(losses[-1])['loss']:.6f}, best validation MSE: {stats['best_val_mse']:.6f}")
with tempfile.TemporaryDirectory() as tmp:
    model = SentenceEncoder.load(str(student.fetch_exported(store, "gpu-check", pathlib.Path(tmp))), device="cuda")
    print(f"STS-B test (Spearman x100): {sts.score(lambda t: model.encode(t, batch_size=256), sts.stsb_test()):.2f}")
PY
echo "total: $(( $(date +%s) - start )) s"
