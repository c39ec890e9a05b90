#!/bin/bash
# A short decode A/B on the GPU machine, for kernel work between full runs of run.sh: the
# real-size models (synthesized once per machine), plans built with --no-tune (no tactic
# timing: quick), then `kiln bench` at batch 1 (and the --batches given) for each setting of
# the environment variables named (each run with VAR=1 and VAR=0), with KILN_CUDA_PROFILE=steps
# so that the log shows each step size's GPU time beside its wall time (--no-profile: without
# it, for changes to what the host does between steps, which the profile's waits would hide).
# Run from the folder scripts/device/pack.sh filled. Logs in $OUT/decode_ab.log.
# Usage: decode_ab.sh [--runs N] [--batches "1 16"] [--models "bloom-560m flan-t5-large"]
#                     [--no-profile] VAR...
# where each VAR is a name (runs with 1, then 0) or NAME=v1,v2,... (runs with each value).
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}
RUNS=3
BATCHES="1"
MODELS="bloom-560m flan-t5-large"
PROFILE=steps
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) RUNS=$2; shift ;;
    --batches) BATCHES=$2; shift ;;
    --models) MODELS=$2; shift ;;
    --no-profile) PROFILE= ;;
    *) break ;;
  esac
  shift
done
source "$HERE/bundle_env.sh"
source "$HERE/untuned_plan.sh"
LOG="$OUT/decode_ab.log"
date -u >>"$LOG"
for model in $MODELS; do
  untuned_plan "$model" || continue
  for b in $BATCHES; do
    for arg in "${@:-NONE}"; do
      var=${arg%%=*} values="1 0"
      [ "$arg" != "$var" ] && values=${arg#*=} && values=${values//,/ }
      for v in $values; do
        echo "== $model $prec batch $b $var=$v" | tee -a "$LOG"
        env "$var=$v" ${PROFILE:+KILN_CUDA_PROFILE=$PROFILE} "$KILN" -v bench --plan "$plan" --input-len 78 \
          --output-len 100 --runs "$RUNS" --batch "$b" 2>&1 |
          grep -E "^ +[0-9]|step profile" | tee -a "$LOG"
        [ "$var" = NONE ] && break
      done
    done
  done
done
