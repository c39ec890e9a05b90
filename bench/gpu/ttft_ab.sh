#!/bin/bash
# Batch-1 prefill (TTFT) of two kiln binaries on the GPU machine, each on the plan it built and
# crossed (each on the other's plan: the plan's part and the runtime's part of a difference),
# then a per-node profile of each (KILN_CUDA_PROFILE=kernels: GPU and host time per node).
# Run from the folder scripts/device/pack.sh filled. Log: $OUT/ttft_ab.log.
# Usage: ttft_ab.sh BEFORE_KILN [MODEL]
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}
BEFORE=$1
model=${2:-bloom-560m}
source "$HERE/bundle_env.sh"
LOG="$OUT/ttft_ab.log"
source "$HERE/untuned_plan.sh"
untuned_plan "$model" || exit 1
after_plan=$plan before_plan=${plan%.plan}-before.plan
[ -f "$before_plan" ] || "$BEFORE" build --model "/tmp/synth/$model" --device cuda --precision "$prec" \
  --max-input-tokens 128 --max-step-tokens 8192 --no-tune -o "$before_plan" >>"$LOG" 2>&1
for round in 1 2; do
  for combo in "before $before_plan" "after $after_plan" "before $after_plan" "after $before_plan"; do
    set -- $combo
    bin=$KILN
    [ "$1" = before ] && bin=$BEFORE
    echo "== round $round binary $1 plan $(basename "$2")" | tee -a "$LOG"
    "$bin" bench --plan "$2" --input-len 78 --output-len 2 --runs 9 --batch 1 2>&1 |
      grep -E "^ +[0-9]|error" | tee -a "$LOG"
  done
done
for combo in "before $before_plan" "after $after_plan"; do
  set -- $combo
  bin=$KILN
  [ "$1" = before ] && bin=$BEFORE
  echo "== profile binary $1" | tee -a "$LOG"
  KILN_CUDA_PROFILE=kernels "$bin" bench --plan "$2" --input-len 78 --output-len 2 --runs 3 \
    --batch 1 -v 2>&1 | grep -E "cuda profile|ms/step" | head -25 | tee -a "$LOG"
done
