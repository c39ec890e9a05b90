#!/bin/bash
# Where a batched step's GPU time goes, by Nsight Compute: the real-size models synthesized and
# built with --no-tune (as decode_ab.sh does), then a short `kiln bench` run of each model at
# each batch under `ncu` (kernel durations only, clocks and caches left alone), summarized per
# kernel and grid by ncu_summary.py. Run from the folder scripts/device/pack.sh filled.
# Usage: profile.sh [--batches "64"] [--models "bloom-560m flan-t5-large"] [--tokens N]
#                   [--detail REGEX]
# Logs in $OUT/profile.log; the CSVs in $OUT/ncu-<model>-b<batch>.csv. --detail REGEX adds, per
# model and batch, ncu's full report (speed of light, memory, warp stalls, occupancy, source
# counters) of two decode-step launches of the kernels whose function name matches REGEX, in
# $OUT/detail-<model>-b<batch>.txt.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}
BATCHES="64"
MODELS="bloom-560m flan-t5-large"
TOKENS=8
DETAIL=""
while [ $# -gt 0 ]; do
  case "$1" in
    --batches) BATCHES=$2; shift ;;
    --models) MODELS=$2; shift ;;
    --tokens) TOKENS=$2; shift ;;
    --detail) DETAIL=$2; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$OUT"
source "$HERE/bundle_env.sh"
source "$HERE/untuned_plan.sh"
LOG="$OUT/profile.log"
date -u >>"$LOG"
command -v ncu >/dev/null || { echo "ncu not found" | tee -a "$LOG"; exit 1; }
for model in $MODELS; do
  untuned_plan "$model" || continue
  for b in $BATCHES; do
    csv="$OUT/ncu-$model-b$b.csv"
    echo "== ncu $model $prec batch $b (prompt 78, $TOKENS new tokens)" | tee -a "$LOG"
    ncu --csv --clock-control none --cache-control none --metrics gpu__time_duration.sum \
      "$KILN" bench --plan "$plan" --input-len 78 --output-len "$TOKENS" --runs 1 --warmup 0 \
      --batch "$b" >"$csv" 2>/dev/null
    python3 "$HERE/ncu_summary.py" "$csv" "$((TOKENS - 1))" 2>&1 | tee -a "$LOG"
    [ -n "$DETAIL" ] || continue
    # Skip the prompt step's launches: the last two decode steps' worth are profiled.
    ncu --clock-control none --kernel-name "regex:$DETAIL" --launch-skip 48 --launch-count 2 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
      --section SchedulerStats --section Occupancy --section LaunchStats --section SourceCounters \
      "$KILN" bench --plan "$plan" --input-len 78 --output-len "$TOKENS" --runs 1 --warmup 0 \
      --batch "$b" >"$OUT/detail-$model-b$b.txt" 2>&1
  done
done
