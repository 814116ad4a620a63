#!/bin/bash
# One device call: training attention that drops nothing on a GPU (after `fused_gpu.sh prepare`, carrying
# .gpu/minilm and .gpu/fused), each stage bounded by its own limit (seconds); call with timeout_s 420:
#   1-3. benchmarks/sdpa_training.py: SDPA's backends against the explicit fp32 math, forward and backward, on
#        sentence batches (bf16, heads of 32 and 64; fp32; a decoder's causal 64-512 tokens)      (60, 30, 60)
#   4-7. benchmarks/fused.py, one MiniLM trial (and 16 fused members in 6), batch 32 and 128: without dropout
#        through SDPA as torch chooses, SDPA without cuDNN, the explicit math; with dropout          (45 each)
set -o pipefail
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$OUT/smi.txt"
python3 benchmarks/device/upcast.py .gpu/minilm /tmp/minilm || exit 1
stage() {  # name, limit, script, its options
  local name=$1 limit=$2 script=$3; shift 3
  local started=$SECONDS
  timeout "$limit" python3 "benchmarks/$script" --device cuda --json "$OUT/$name.json" "$@" 2>&1 \
    | grep -v -E "Loading weights|UserWarning|detach\(\)|return max" | tee "$OUT/$name.log"
  echo "stage $name rc=$? in $((SECONDS - started)) s"
}
stage sdpa_bf16 60 sdpa_training.py --dtype bf16 --head-dim 32,64
stage sdpa_fp32 30 sdpa_training.py --dtype fp32 --head-dim 32
stage sdpa_causal 60 sdpa_training.py --dtype bf16 --head-dim 64 --causal --lengths 64,512 --batch 16 --steps 20
fused=(--model /tmp/minilm --pairs-file .gpu/fused/stsb-train.tsv --batch 32,128 --order aligned --steps 30 --warmup 3)
stage bare_sdpa 45 fused.py "${fused[@]}" --members 1 --dropout none
stage bare_nocudnn 45 fused.py "${fused[@]}" --members 1 --dropout none --sdpa-backends flash,efficient,math
stage bare_explicit 55 fused.py "${fused[@]}" --members 1,16 --dropout none --train-attention explicit
stage dropout 45 fused.py "${fused[@]}" --members 1 --dropout member
