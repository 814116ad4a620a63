#!/bin/bash
# One device call for the checks that only a GPU answers (after prepare.sh and `fused_gpu.sh prepare`, carrying
# .gpu/whl, .gpu/data, .gpu/minilm and .gpu/fused; about 50 MB), each stage bounded by its own limit (seconds):
#   1. same_seed.py: MiniLM `finetune`, one epoch of STS-B train, seed 0 three times and seeds 1, 2, fp32 and bf16:
#      how far a rerun of the same seed lands from itself against the seed-to-seed SD (issue 54, closed: off unless
#      SEED_LIMIT=230)                                                                         (SEED_LIMIT, 0: off)
#   2. fused.py: one trial alone against 8 and 16 fused members (aligned order), batch 32 and 128 (issue 56)
#                                                                                             (FUSED_LIMIT, 75)
#   3. the same without dropout on every side: what the members' masks cost                  (BARE_LIMIT, 65)
#   4. fused.py --separate: 8 trials as 8 processes at once against 8 and 16 fused members (each member's own
#      order, as the launcher trains them), batch 32, in one run (issue 56)              (SEPARATE_LIMIT, 0: off)
#   5. padding_free.py: one trial padded against packed (padding-free), batch 32 and 128, bf16 with dropout, then
#      one epoch each way and STS-B test Spearman (issue 56's >= 1.5x at batch 128, Spearman to 0.1; needs
#      .gpu/fused/train.tsv and test.tsv from `fused_gpu.sh prepare`)                        (PADDING_LIMIT, 150)
#   6. the same without dropout: attention through torch's varlen kernel                      (VARLEN_LIMIT, 60)
# A stage's *_LIMIT=0 skips it. Each stage writes $OUT/<stage>.json and .log; call with timeout_s 480.
set -o pipefail
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee "$OUT/smi.txt"
python3 -m pip list 2>/dev/null | grep -iE "^(torch|transformers|tokenizers|numpy|pandas|pydantic|datasets) " \
  | tee "$OUT/versions.txt"
python3 benchmarks/device/upcast.py .gpu/minilm /tmp/minilm || exit 1

stage() {  # name, limit, script, its options
  local name=$1 limit=$2 script=$3; shift 3
  [ "$limit" = 0 ] && return
  local started=$SECONDS
  timeout "$limit" python3 "benchmarks/$script" --device cuda --model /tmp/minilm --json "$OUT/$name.json" "$@" 2>&1 \
    | grep -v -E "Loading weights|warmup_ratio" | tee "$OUT/$name.log"
  echo "stage $name rc=$? in $((SECONDS - started)) s"
}
stage same_seed "${SEED_LIMIT:-0}" same_seed.py --data-dir .gpu/data --precision fp32,bf16 --repeats 3 --seeds 3
stage fused "${FUSED_LIMIT:-75}" fused.py --pairs-file .gpu/fused/stsb-train.tsv --members 8,16 --batch 32,128 \
  --order aligned --steps 30 --warmup 3
stage fused_bare "${BARE_LIMIT:-65}" fused.py --pairs-file .gpu/fused/stsb-train.tsv --members 8,16 --batch 32,128 \
  --order aligned --steps 30 --warmup 3 --dropout none
stage separate "${SEPARATE_LIMIT:-0}" fused.py --pairs-file .gpu/fused/stsb-train.tsv --members 8,16 --batch 32 \
  --order trial --separate 8 --steps 30 --warmup 3
stage padding "${PADDING_LIMIT:-150}" padding_free.py --pairs-file .gpu/fused/train.tsv --test-file .gpu/fused/test.tsv \
  --batch 32,128 --steps 30 --warmup 3 --score-epochs 1
stage varlen "${VARLEN_LIMIT:-60}" padding_free.py --pairs-file .gpu/fused/train.tsv --batch 32,128 --steps 30 \
  --warmup 3 --dropout none
