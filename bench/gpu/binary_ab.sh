#!/bin/bash
# A decode A/B of two kiln binaries on the GPU machine, for changes an environment switch cannot
# turn off (host-side work between steps): the bundle's kiln ("after") against BEFORE (a kiln
# built from an earlier commit, with the same shared libraries), `kiln bench` on the same
# untuned plans (untuned_plan.sh), the two binaries interleaved in each round so that both see
# the same state of the machine. No profiling (its waits would hide host time).
# Run from the folder scripts/device/pack.sh filled. Logs in $OUT/binary_ab.log.
# Usage: binary_ab.sh BEFORE [--rounds R] [--runs N] [--batches "1 16"] [--models "..."]
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}
BEFORE=$1
shift
ROUNDS=3
RUNS=5
BATCHES="1"
MODELS="bloom-560m flan-t5-large"
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift ;;
    --runs) RUNS=$2; shift ;;
    --batches) BATCHES=$2; shift ;;
    --models) MODELS=$2; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
source "$HERE/bundle_env.sh"
source "$HERE/untuned_plan.sh"
LOG="$OUT/binary_ab.log"
date -u >>"$LOG"
for model in $MODELS; do
  untuned_plan "$model" || continue
  for b in $BATCHES; do
    for round in $(seq "$ROUNDS"); do
      for variant in before after; do
        bin=$KILN
        [ "$variant" = before ] && bin=$BEFORE
        echo "== $model $prec batch $b round $round $variant" | tee -a "$LOG"
        "$bin" bench --plan "$plan" --input-len 78 --output-len 100 --runs "$RUNS" \
          --batch "$b" 2>&1 | grep -E "^ +[0-9]" | tee -a "$LOG"
      done
    done
  done
done
