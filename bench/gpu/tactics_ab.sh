#!/bin/bash
# What build-time tactics are worth per batch, on the GPU machine: each model's real-size
# checkpoint built twice (tactics timed, and --no-tune), then `kiln bench` at each batch alone
# on each plan, the tuned one with KILN_CUDA_TACTICS_INEXACT=0 (default: prompts' row counts that
# were not timed run cuBLASLt's heuristic) and =1 (the tactic of the next larger timed count),
# interleaved, for ROUNDS rounds. Run from the folder scripts/device/pack.sh filled.
# Usage: tactics_ab.sh [--rounds N] [--batches "1 64"] [--models "bloom-560m flan-t5-large"]
# Log: $OUT/tactics_ab.log.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}
ROUNDS=2
BATCHES="1 64"
MODELS="bloom-560m flan-t5-large"
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift ;;
    --batches) BATCHES=$2; shift ;;
    --models) MODELS=$2; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
source "$HERE/bundle_env.sh"
source "$HERE/untuned_plan.sh"
LOG="$OUT/tactics_ab.log"
date -u >>"$LOG"
for model in $MODELS; do
  untuned_plan "$model" || continue
  tuned=${plan%-ab.plan}-tuned.plan
  [ -f "$tuned" ] || "$KILN" build --model "/tmp/synth/$model" --device cuda --precision "$prec" \
    --max-input-tokens 128 --max-step-tokens 8192 -o "$tuned" >>"$LOG" 2>&1 ||
    { echo "build $model (tuned) failed" | tee -a "$LOG"; continue; }
  for round in $(seq "$ROUNDS"); do
    for b in $BATCHES; do
      for variant in untuned tuned tuned-inexact; do
        p=$tuned inexact=0
        [ "$variant" = untuned ] && p=$plan
        [ "$variant" = tuned-inexact ] && inexact=1
        echo "== $model $prec batch $b $variant (round $round)" | tee -a "$LOG"
        KILN_CUDA_TACTICS_INEXACT=$inexact "$KILN" bench --plan "$p" --input-len 78 \
          --output-len 100 --runs 3 --batch "$b" 2>&1 | grep -E "^ +[0-9]" | tee -a "$LOG"
      done
    done
  done
done
