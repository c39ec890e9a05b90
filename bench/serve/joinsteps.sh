#!/bin/bash
# What a joining prompt costs the served throughput on the GPU machine (issue 37's 85 % target):
# `kiln bench` of bloom-560m fp16 decode at batch 64 from CUDA graphs and eagerly
# (KILN_CUDA_GRAPHS=0), the prefill of the served prompt length at a few batch sizes, then
# `kiln serve` under `kiln perf` (64 streaming OpenAI clients, 100 tokens each, as h200.sh) with
# KILN_CUDA_PROFILE=steps (the executor logs, per token count, the steps run and their GPU and
# wall time when the server stops) and, without the profile, once per KILN_JOIN_HOLD_STEPS value.
# Run from the folder scripts/device/pack.sh filled. Log: $OUT/joinsteps.log.
# Usage: [HOLDS="4 8 16"] joinsteps.sh [DURATION_S]
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}
DUR=${1:-10}
source "$HERE/bundle_env.sh"
LOG="$OUT/joinsteps.log"
mkdir -p /tmp/synth /tmp/plans
dir=/tmp/synth/bloom-560m plan=/tmp/plans/bloom-560m-fp16-serve.plan
[ -d "$dir" ] || "$KILN" synth --preset bloom-560m --dtype fp16 -o "$dir" >>"$LOG" 2>&1
[ -f "$plan" ] || "$KILN" build --model "$dir" --device cuda --precision fp16 \
  --max-input-tokens 512 --max-step-tokens 8192 -o "$plan" >>"$LOG" 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$LOG"
for graphs in 1 0; do
  echo "KILN_CUDA_GRAPHS=$graphs decode batch 64" | tee -a "$LOG"
  KILN_CUDA_GRAPHS=$graphs "$KILN" bench --plan "$plan" --input-len 100 --output-len 100 --runs 3 \
    --batch 64 --json 2>>"$LOG" | tee -a "$LOG"
done
echo "prefill of 100-token prompts" | tee -a "$LOG"
"$KILN" bench --plan "$plan" --input-len 100 --output-len 1 --runs 3 --sweep batch=1,4,16,64 \
  --json 2>>"$LOG" | tee -a "$LOG"
serve() {  # label, then environment assignments for the server
  local label=$1
  shift
  start_server "$label" "$plan" "$@" || return
  local url=$SERVER_URL metrics=$METRICS_URL
  echo "serve $label ($*)" | tee -a "$LOG"
  "$KILN" perf --url "$url" --model m --prompt-len 28 --output-len 100 --ignore-eos --stream \
    --concurrency 64 --duration "$DUR" --warmup 2 2>&1 | tee -a "$LOG"
  curl -s "$metrics" | grep -E '^(nv_inference_exec_count|kiln_steps_run_ahead_total|kiln_engine_busy_seconds_total|kiln_output_tokens_total|kiln_input_tokens_total|kiln_batch_size_(sum|count))' |
    sed "s/^/$label /" | tee -a "$LOG"
  stop_server
  # Per token count: steps, GPU ms and wall ms per step; then totals for decode-sized steps
  # (<= 64 tokens) and the larger ones (prompts joining).
  grep -E "cuda step profile" "$OUT/serve-$label.err" |
    sed -n 's/.*: \([0-9]*\) steps of \([0-9]*\) tokens: \([0-9.]*\) ms per step on the GPU, \([0-9.]*\) ms.*/\1 \2 \3 \4/p' |
    sort -k2 -n | tee -a "$LOG" |
    awk '{k = ($2 <= 64) ? "decode" : "joined"; n[k] += $1; g[k] += $1 * $3; w[k] += $1 * $4; t[k] += $1 * $2}
         END {for (k in n) printf "%s steps: %d, tokens/step %.1f, GPU %.3f ms/step, wall %.3f ms/step, GPU total %.0f ms\n", k, n[k], t[k] / n[k], g[k] / n[k], w[k] / n[k], g[k]}' |
    tee -a "$LOG"
}
serve profile KILN_CUDA_PROFILE=steps KILN_JOIN_HOLD_STEPS=4
for hold in ${HOLDS:-4 8 16}; do
  serve "hold$hold" KILN_JOIN_HOLD_STEPS=$hold
done
