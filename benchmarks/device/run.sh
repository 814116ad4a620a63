#!/bin/bash
# What a call of the device tool runs (after prepare.sh, carrying .gpu): benchmarks/gpu.py on MiniLM with
# the image's torch, transformers and sentence-transformers, pydantic and datasets from the carried wheels.
# GPU_ARGS replaces gpu.py's options below; GPU_LIMIT (seconds) bounds it inside the call's timeout.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,utilization.gpu --format=csv | tee "$OUT/smi.txt"
lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$OUT/smi.txt"
python3 -m pip list 2>/dev/null | grep -iE "^(torch|transformers|sentence-transformers|tokenizers|huggingface.hub|pyarrow|pandas|numpy) " | tee "$OUT/versions.txt"
python3 benchmarks/device/upcast.py .gpu/minilm /tmp/minilm || exit 1
# shellcheck disable=SC2086
timeout "${GPU_LIMIT:-400}" python3 benchmarks/gpu.py --data-dir .gpu/data --device cuda --models /tmp/minilm \
  ${GPU_ARGS:---batches 32,128 --score --repeats 2 --before --packing none} --json "$OUT/gpu.json" 2>&1 \
  | grep -v -E "warmup_ratio|Computing widget" | tee "$OUT/gpu.log"
echo "gpu.py rc=$?"
