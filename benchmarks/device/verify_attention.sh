#!/bin/bash
# One device call after attention.sh: SDPA without cuDNN (trainables.models.attention.sdpa) in a MiniLM step
# without dropout, 1 trial and 16 fused members, batch 32 and 128; then with dropout (unless BARE_ONLY=1).
# Carries .gpu/minilm and .gpu/fused (`fused_gpu.sh prepare`); call with timeout_s 150.
set -o pipefail
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
python3 benchmarks/device/upcast.py .gpu/minilm /tmp/minilm || exit 1
f=(--model /tmp/minilm --pairs-file .gpu/fused/stsb-train.tsv --batch 32,128 --order aligned --steps 30 --warmup 3)
timeout 70 python3 benchmarks/fused.py --device cuda "${f[@]}" --members 1,16 --dropout none --json $OUT/fixed_bare.json 2>&1 | grep -v "Loading weights" | tee $OUT/fixed_bare.log
if [ -z "${BARE_ONLY:-}" ]; then timeout 40 python3 benchmarks/fused.py --device cuda "${f[@]}" --members 1 --dropout member --json $OUT/fixed_dropout.json 2>&1 | grep -v "Loading weights" | tee $OUT/fixed_dropout.log
fi
