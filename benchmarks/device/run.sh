#!/bin/bash
# What a call of the device tool runs (after prepare.sh, carrying .gpu): benchmarks/gpu.py with the image's torch,
# transformers and sentence-transformers, pydantic and datasets from the carried wheels, in three stages, each
# bounded by its own limit (seconds) so that one overrun leaves the next its time. On the H100 (2026-11-26) stage 1
# ran past its 200 s at batch 128 (which alone took 101 s in a call of its own), stage 2's 1, 2 and 4 processes took
# 110 s and 8 another 50 s, stage 3 134 s; hence the limits below and the call's timeout_s of 600 (560 s and setup):
#   1. MiniLM, both sides trained and encoded, test Spearman after each epoch    (GPU_ARGS,   GPU_LIMIT,   240)
#   2. MiniLM, 1/2/4/8 one-epoch trials sharing the device as processes          (PACK_ARGS,  PACK_LIMIT,  170)
#   3. MPNet with weights drawn from its config: speed only, no Spearman          (MPNET_ARGS, MPNET_LIMIT, 150)
# A stage's *_LIMIT=0 skips it. Each stage writes $OUT/<stage>.json and .log.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.max.sm,temperature.gpu,utilization.gpu --format=csv | tee "$OUT/smi.txt"
lscpu | grep -E "Model name|^CPU\(s\)" | tee -a "$OUT/smi.txt"
python3 -m pip list 2>/dev/null | grep -iE "^(torch|transformers|sentence-transformers|tokenizers|huggingface.hub|pyarrow|pandas|numpy) " | tee "$OUT/versions.txt"
python3 benchmarks/device/upcast.py .gpu/minilm /tmp/minilm || exit 1

stage() {  # name, limit, model folder, gpu.py's options
  local name=$1 limit=$2 model=$3; shift 3
  [ "$limit" = 0 ] && return
  local started=$SECONDS
  # shellcheck disable=SC2068
  timeout "$limit" python3 benchmarks/gpu.py --data-dir .gpu/data --device cuda --models "$model" $@ \
    --json "$OUT/$name.json" 2>&1 | grep -v -E "warmup_ratio|Computing widget" | tee "$OUT/$name.log"
  echo "stage $name rc=$? in $((SECONDS - started)) s"
}
# shellcheck disable=SC2086
stage train "${GPU_LIMIT:-240}" /tmp/minilm ${GPU_ARGS:---batches 32,128 --score --repeats 2 --packing none}
# shellcheck disable=SC2086
stage pack "${PACK_LIMIT:-170}" /tmp/minilm ${PACK_ARGS:---batches 32 --repeats 1 --packing 1,2,4,8 --packing-mode processes --no-compare}
if [ -d .gpu/mpnet ] && [ "${MPNET_LIMIT:-150}" != 0 ]; then
  python3 benchmarks/device/upcast.py --draw .gpu/mpnet /tmp/mpnet || exit 1
  # shellcheck disable=SC2086
  stage mpnet "${MPNET_LIMIT:-150}" /tmp/mpnet ${MPNET_ARGS:---batches 32,128 --repeats 1 --encode-passes 2 --packing none}
fi
