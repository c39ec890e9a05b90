#!/bin/bash
# kiln serve on the H200 against kiln bench on the same plan, in one device run: bloom-560m fp16
# and flan-t5-large bf16 (kiln synth weights, the plans bench/gpu/run.sh builds): `kiln serve
# --plan` (time to /v2/health/ready) driven by `kiln perf` with 16 and 64 concurrent streaming
# clients (100 output tokens each, EOS ignored), then `kiln bench` decode at batch 16 and 64
# from prompts of the served prompts' mean token count (read from the server's metrics). Logs and JSON in $OUT; bench/serve/summarize.py makes the table.
# Run from the folder scripts/device/pack.sh filled. Usage: h200.sh [DURATION_S]
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
FINAL=${OUT:-/tmp/out}
DUR=${1:-20}
# The device tool brings back at most 8 files: the raw logs and JSON go into one archive.
OUT=$(mktemp -d)
source "$HERE/bundle_env.sh"
LOG="$OUT/serve.log"
mkdir -p /tmp/synth /tmp/plans
date -u | tee "$LOG"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$LOG"
nproc | sed 's/^/host cores: /' | tee -a "$LOG"

serve_model() {  # preset synth-dtype precision
  local preset=$1 sdtype=$2 prec=$3 dir=/tmp/synth/$1 plan=/tmp/plans/$1-$3.plan
  [ -d "$dir" ] || "$KILN" synth --preset "$preset" --dtype "$sdtype" -o "$dir" >>"$LOG" 2>&1
  "$KILN" build --model "$dir" --device cuda --precision "$prec" --max-input-tokens 512 \
    --max-step-tokens 8192 -o "$plan" >>"$LOG" 2>&1 || { echo "build $preset failed" | tee -a "$LOG"; return; }
  # The server: from the exec to a 200 from /v2/health/ready.
  start_server "$preset" "$plan" || { echo "serve $preset failed" | tee -a "$LOG"; return; }
  local url=$SERVER_URL
  echo "{\"preset\": \"$preset\", \"ready_ms\": $SERVER_READY_MS}" | tee "$OUT/ready-$preset.json" | tee -a "$LOG"
  "$KILN" perf --url "$url" --model m --prompt-len 28 --output-len 100 --ignore-eos --stream \
    --concurrency 16,64 --duration "$DUR" --warmup 3 --json >"$OUT/perf-$preset.json" 2>>"$LOG" ||
    echo "perf $preset failed" | tee -a "$LOG"
  cat "$OUT/perf-$preset.json" >>"$LOG"
  # The same load over KServe's generate_stream (Triton's clients) at 64.
  "$KILN" perf --url "$url" --model m --protocol kserve --prompt-len 28 --output-len 100 \
    --ignore-eos --stream --concurrency 64 --duration "$DUR" --warmup 3 --json \
    >"$OUT/perf-kserve-$preset.json" 2>>"$LOG" || echo "perf kserve $preset failed" | tee -a "$LOG"
  curl -s "${url%%/v2*}" >/dev/null
  [ -n "$METRICS_URL" ] && curl -s "$METRICS_URL" >"$OUT/metrics-$preset.txt"
  stop_server
  echo "serve $preset exit $?" | tee -a "$LOG"
  tail -5 "$OUT/serve-$preset.err" | tee -a "$LOG"
  # The bench decodes from prompts of the served prompts' mean length (from the metrics: the
  # decode step's time grows with the context, so a shorter bench prompt flatters the bench).
  local in_len
  in_len=$(awk '/^kiln_input_tokens_total/ {t += $NF} /^nv_inference_request_success/ {n += $NF}
                END {if (n > 0) printf "%d", t / n + 0.5}' "$OUT/metrics-$preset.txt" 2>/dev/null)
  [ -n "$in_len" ] && [ "$in_len" -gt 0 ] || in_len=100
  echo "bench $preset: --input-len $in_len (the served prompts' mean)" | tee -a "$LOG"
  "$KILN" bench --plan "$plan" --input-len "$in_len" --output-len 100 --runs 3 \
    --sweep batch=16,64 --json >"$OUT/bench-$preset.jsonl" 2>>"$LOG" ||
    echo "bench $preset failed" | tee -a "$LOG"
  cat "$OUT/bench-$preset.jsonl" >>"$LOG"
}

serve_model bloom-560m fp16 fp16
serve_model flan-t5-large fp32 bf16
[ -x "$(command -v python3)" ] && python3 "$HERE/summarize_serve.py" "$OUT" | tee "$OUT/summary.md"
mkdir -p "$FINAL"
cp "$OUT/summary.md" "$FINAL/" 2>/dev/null
tar -C "$OUT" -czf "$FINAL/serve-raw.tar.gz" .
