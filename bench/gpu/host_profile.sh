#!/bin/bash
# Where the host's time goes between a prompt's encoder step and its first decode step, on the
# GPU machine: Nsight Systems samples kiln's threads (every 125000 cycles, frame-pointer stacks)
# during a `kiln bench` of flan-t5-large (untuned plan, untuned_plan.sh) and host_profile_query.py
# counts the sampled functions in those windows (the API trace gives their bounds). Found the
# host time in batch-64 time to first token (bench/gpu/h200-2026-12-01w-ttft-host-profile.log).
# Usage: host_profile.sh [--batch 64] [--model flan-t5-large]. Logs in $OUT/host_profile.log.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}
BATCH=64
MODEL=flan-t5-large
while [ $# -gt 0 ]; do
  case "$1" in
    --batch) BATCH=$2; shift ;;
    --model) MODEL=$2; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$OUT"
source "$HERE/bundle_env.sh"
source "$HERE/untuned_plan.sh"
LOG="$OUT/host_profile.log"
date -u >>"$LOG"
untuned_plan "$MODEL" || exit 1
NSYS=$(command -v nsys || find / -name nsys -type f -perm -u+x -not -path '/proc/*' 2>/dev/null | head -1)
[ -n "$NSYS" ] || { echo "nsys not found" | tee -a "$LOG"; exit 1; }
export LD_LIBRARY_PATH="$LD_LIBRARY_PATH:$HERE/x/toollib"
rep=/tmp/host-profile-$MODEL-b$BATCH
"$NSYS" profile --trace=cuda --sample=process-tree --sampling-period=125000 --backtrace=fp \
  --cpuctxsw=none -o "$rep" --force-overwrite true "$KILN" bench --plan "$plan" --input-len 78 \
  --output-len 8 --runs 5 --warmup 1 --batch "$BATCH" >>"$LOG" 2>&1
"$NSYS" export --type sqlite -o "$rep.sqlite" --force-overwrite true "$rep.nsys-rep" >/dev/null 2>&1
python3 "$HERE/host_profile_query.py" "$rep.sqlite" 2>&1 | tee -a "$LOG"
