#!/bin/bash
# A decode A/B of two kiln binaries on the GPU machine, for changes an environment switch cannot
# turn off (host-side work between steps): the bundle's kiln ("after") against BEFORE (a kiln
# built from an earlier commit, with the same shared libraries), `kiln bench` on the same
# untuned plans (untuned_plan.sh), the two binaries interleaved in each round so that both see
# the same state of the machine. No profiling (its waits would hide host time). --own-plans:
# BEFORE runs a plan it built itself (for changes to the build's passes).
# Run from the folder scripts/device/pack.sh filled. Logs in $OUT/binary_ab.log.
# Usage: binary_ab.sh BEFORE [--rounds R] [--runs N] [--batches "1 16"] [--models "..."]
#                     [--own-plans]
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}
if [ $# -lt 1 ] || [ ! -x "$1" ]; then
  echo "usage: binary_ab.sh BEFORE_KILN [--rounds R] [--runs N] [--batches \"1 16\"] [--models \"...\"] [--own-plans]" >&2
  exit 2
fi
BEFORE=$1
shift
ROUNDS=3
RUNS=5
BATCHES="1"
MODELS="bloom-560m flan-t5-large"
OWN_PLANS=0
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) ROUNDS=$2; shift ;;
    --runs) RUNS=$2; shift ;;
    --batches) BATCHES=$2; shift ;;
    --models) MODELS=$2; shift ;;
    --own-plans) OWN_PLANS=1 ;;
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
  before_plan=$plan
  if [ "$OWN_PLANS" = 1 ]; then
    before_plan=${plan%.plan}-before.plan
    rm -f "$before_plan"  # BEFORE may be another binary than the last run's
    "$BEFORE" build --model "/tmp/synth/$model" --device cuda \
      --precision "$prec" --max-input-tokens 128 --max-step-tokens 8192 --no-tune \
      -o "$before_plan" >>"$LOG" 2>&1 || { echo "before build $model failed" | tee -a "$LOG"; continue; }
  fi
  for b in $BATCHES; do
    for round in $(seq "$ROUNDS"); do
      for variant in before after; do
        bin=$KILN p=$plan
        [ "$variant" = before ] && bin=$BEFORE p=$before_plan
        echo "== $model $prec batch $b round $round $variant" | tee -a "$LOG"
        "$bin" bench --plan "$p" --input-len 78 --output-len 100 --runs "$RUNS" \
          --batch "$b" 2>&1 | grep -E "^ +[0-9]" | tee -a "$LOG"
      done
    done
  done
done
