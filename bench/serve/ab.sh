#!/bin/bash
# Served throughput of scheduler/backend variants on the GPU machine, interleaved in rounds:
# `kiln bench` decode at batch 64 from prompts of the served prompts' length (the denominator),
# then per variant `kiln serve` under `kiln perf` (64 streaming OpenAI clients, 28-word prompts,
# 100 output tokens each, EOS ignored, as h200.sh), with the rows a step ran and the steps run
# ahead from the server's metrics. A variant is one argument: a label, then NAME=VALUE
# environment settings for its server (BIN=PATH: another kiln binary).
# Run from the folder scripts/device/pack.sh filled. Log: $OUT/ab-PRESET.log.
# Usage: ab.sh PRESET SYNTH_DTYPE PRECISION DURATION_S ROUNDS "LABEL [NAME=VALUE ...]" ...
# e.g.   ab.sh bloom-560m fp16 fp16 10 2 "g64 KILN_CUDA_GRAPH_TOKENS=64" "g256"
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}
preset=$1 sdtype=$2 prec=$3 dur=$4 rounds=$5
shift 5
source "$HERE/bundle_env.sh"
LOG="$OUT/ab-$preset.log"
mkdir -p /tmp/synth /tmp/plans
dir=/tmp/synth/$preset plan=/tmp/plans/$preset-$prec-serve.plan
[ -d "$dir" ] || "$KILN" synth --preset "$preset" --dtype "$sdtype" -o "$dir" >>"$LOG" 2>&1
[ -f "$plan" ] || "$KILN" build --model "$dir" --device cuda --precision "$prec" \
  --max-input-tokens 512 --max-step-tokens 8192 -o "$plan" >>"$LOG" 2>&1
nvidia-smi --query-gpu=name --format=csv,noheader | tee -a "$LOG"
echo "kiln bench $preset $prec decode at batch 64, 100-token prompts" | tee -a "$LOG"
"$KILN" bench --plan "$plan" --input-len 100 --output-len 100 --runs 3 --batch 64 --json \
  2>>"$LOG" | tee -a "$LOG"
for round in $(seq "$rounds"); do
  for variant in "$@"; do
    read -r -a words <<<"$variant"
    label=${words[0]}
    start_server "$label" "$plan" "${words[@]:1}" || continue
    echo "== round $round $variant (ready in $SERVER_READY_MS ms)" | tee -a "$LOG"
    "$KILN" perf --url "$SERVER_URL" --model m --prompt-len 28 --output-len 100 --ignore-eos \
      --stream --concurrency 64 --duration "$dur" --warmup 2 2>&1 |
      grep -E "concurrency|first token|inter-token|error" | tee -a "$LOG"
    curl -s "$METRICS_URL" |
      awk -v l="$label" '/^kiln_batch_size_sum/ {s = $NF} /^kiln_batch_size_count/ {c = $NF}
        /^kiln_steps_run_ahead_total/ {a = $NF} /^kiln_encoder_steps_total/ {e = $NF}
        /^nv_inference_request_success/ {n += $NF}
        /^kiln_step_launches_total.*graph="decoder"/ {match($0, /launch="[a-z]+"/); d[substr($0, RSTART + 8, RLENGTH - 9)] = $NF}
        /^kiln_step_launches_total.*graph="encoder"/ {match($0, /launch="[a-z]+"/); en[substr($0, RSTART + 8, RLENGTH - 9)] = $NF}
        /^kiln_step_capture_seconds_total/ {cs += $NF}
        END {if (c > 0) printf "%s: %.1f rows a step over %d steps, %d run ahead, %d encoder steps for %d requests; decoder steps replayed %d captured %d eager %d, encoder replayed %d captured %d eager %d, %.2f s capturing\n", l, s / c, c, a, e, n, d["replayed"], d["captured"], d["eager"], en["replayed"], en["captured"], en["eager"], cs}' |
      tee -a "$LOG"
    stop_server
  done
done
