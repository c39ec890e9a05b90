#!/bin/bash
# Where served throughput goes at 64 clients on the GPU machine: `kiln bench` decode of
# bloom-560m fp16 at batch 64 with run-ahead (default) and without (KILN_RUN_AHEAD=0: the host
# reads each step's tokens before the next is queued), then `kiln serve` under `kiln perf` (64
# streaming OpenAI clients, 100 tokens each, as h200.sh) with its metrics scraped: steps, steps
# run ahead, engine busy time. Run from the folder scripts/device/pack.sh filled.
# Usage: [HOLDS="0 4 8"] [AHEADS='"" 0'] runahead.sh [DURATION_S] [PRESET] [SYNTH_DTYPE] [PRECISION]
# (HOLDS: KILN_JOIN_HOLD_STEPS values, a server each; AHEADS: KILN_RUN_AHEAD values for the bench)
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}
DUR=${1:-10}
preset=${2:-bloom-560m} sdtype=${3:-fp16} prec=${4:-fp16}
source "$HERE/bundle_env.sh"
LOG="$OUT/runahead-$preset.log"
mkdir -p /tmp/synth /tmp/plans
dir=/tmp/synth/$preset plan=/tmp/plans/$preset-$prec-serve.plan
[ -d "$dir" ] || "$KILN" synth --preset "$preset" --dtype "$sdtype" -o "$dir" >>"$LOG" 2>&1
[ -f "$plan" ] || "$KILN" build --model "$dir" --device cuda --precision "$prec" \
  --max-input-tokens 512 --max-step-tokens 8192 -o "$plan" >>"$LOG" 2>&1
scrape() {
  curl -s "$metrics" | grep -E '^(nv_inference_exec_count|kiln_steps_run_ahead_total|kiln_engine_busy_seconds_total|kiln_output_tokens_total|kiln_input_tokens_total|kiln_batch_size_(sum|count))' |
    sed "s/^/$1 /" | tee -a "$LOG"
}
for ahead in ${AHEADS:-""}; do
  echo "KILN_RUN_AHEAD=${ahead:-default}" | tee -a "$LOG"
  KILN_RUN_AHEAD=$ahead "$KILN" bench --plan "$plan" --input-len 40 --output-len 100 --runs 3 \
    --batch 64 --json 2>>"$LOG" | tee -a "$LOG"
done
for hold in ${HOLDS:-4}; do
url=""
KILN_JOIN_HOLD_STEPS=$hold "$KILN" serve --plan "$plan" --name m --http-port 0 --grpc-port -1 --metrics-port 0 \
  --max-batch 64 --http-threads 256 >"$OUT/serve.out" 2>"$OUT/serve.err" &
pid=$!
for _ in $(seq 1 2000); do
  [ -z "$url" ] && url=$(sed -n 's|^kiln serve: HTTP on \(http://[^ ]*\).*|\1|p' "$OUT/serve.out")
  [ -n "$url" ] && [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/v2/health/ready")" = 200 ] && break
  sleep 0.005
done
metrics=$(sed -n 's|^kiln serve: metrics on \(http://[^ ]*\).*|\1|p' "$OUT/serve.out")
echo "KILN_JOIN_HOLD_STEPS=$hold" | tee -a "$LOG"
"$KILN" perf --url "$url" --model m --prompt-len 28 --output-len 100 --ignore-eos --stream \
  --concurrency 64 --duration "$DUR" --warmup 2 2>&1 | tee -a "$LOG"
scrape after
kill -TERM "$pid"
wait "$pid"
done
grep -E "engine ready|uploaded" "$OUT/serve.err" | tee -a "$LOG"
