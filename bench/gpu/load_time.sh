#!/bin/bash
# Plan load time on the GPU machine (issue: every machine and every size, part 3): kiln synth
# weights of bloom-560m (1.1 GB fp16) and bloom-3b (6 GB fp16) built into CUDA fp16 plans, then
# `kiln bench --json` run several times per upload setting: its load_ms (the plan's own load:
# read, weights to the GPU, compile) and context_ms (the backend: CUDA context, cuBLASLt) apart.
# KILN_CUDA_UPLOAD_THREADS=0 is the old way (each weight uploaded alone when first used). The
# plans are in the page cache (just built), as a server's are after its first start.
# Run from the folder scripts/device/pack.sh filled. Usage: load_time.sh [PRESETS...]
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}
source "$HERE/bundle_env.sh"
LOG="$OUT/load_time.log"
JSON="$OUT/load_time.jsonl"
mkdir -p /tmp/synth /tmp/plans
PRESETS=("$@")
[ ${#PRESETS[@]} -gt 0 ] || PRESETS=(bloom-560m bloom-3b)
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$LOG"
nproc | sed 's/^/host cores: /' | tee -a "$LOG"
for preset in "${PRESETS[@]}"; do
  dir=/tmp/synth/$preset plan=/tmp/plans/$preset-fp16.plan
  [ -d "$dir" ] || "$KILN" synth --preset "$preset" --dtype fp16 -o "$dir" >>"$LOG" 2>&1
  [ -f "$plan" ] || "$KILN" build --model "$dir" --device cuda --precision fp16 -o "$plan" \
    >>"$LOG" 2>&1 || { echo "build $preset failed" | tee -a "$LOG"; continue; }
  ls -l "$plan" | tee -a "$LOG"
  # threads:chunk MiB ("-": the default)
  for setting in 0:- 1:- 2:- 4:- 8:- -:1 -:16 -:- ; do
    threads=${setting%%:*} chunk=${setting##*:}
    for run in 1 2 3; do
      env $([ "$threads" != - ] && echo KILN_CUDA_UPLOAD_THREADS=$threads) \
        $([ "$chunk" != - ] && echo KILN_CUDA_UPLOAD_CHUNK_MB=$chunk) \
        "$KILN" bench --plan "$plan" --input-len 8 --output-len 2 --runs 1 --warmup 0 --json \
        2>>"$LOG" |
        python3 -c "import json,sys; r=json.loads(sys.stdin.readline()); print(json.dumps({'preset': '$preset', 'threads': '$threads', 'chunk_mb': '$chunk', 'run': $run, 'load_ms': round(r['load_ms'], 1), 'context_ms': round(r['context_ms'], 1), **{k: round(v, 1) for k, v in r['load_parts_ms'].items()}}))" |
        tee -a "$JSON"
    done
  done
  "$KILN" -v bench --plan "$plan" --input-len 8 --output-len 2 --runs 1 \
    --warmup 0 2>&1 | grep -E "uploaded|engine ready|load " | tee -a "$LOG"
done
