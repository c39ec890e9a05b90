#!/bin/bash
# kiln serve of two binaries on the GPU machine, interleaved: bloom-560m fp16 under `kiln perf`
# (64 streaming OpenAI clients, 100 tokens each, EOS ignored, as h200.sh), the after binary's
# kiln perf driving both. Run from the folder scripts/device/pack.sh filled.
# Log: $OUT/serve_ab.log. Usage: serve_ab.sh BEFORE_KILN [DURATION_S] [ROUNDS]
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}
BEFORE=$1 DUR=${2:-10} ROUNDS=${3:-2}
source "$HERE/bundle_env.sh"
LOG="$OUT/serve_ab.log"
mkdir -p /tmp/synth /tmp/plans
dir=/tmp/synth/bloom-560m plan=/tmp/plans/bloom-560m-fp16-serve.plan
[ -d "$dir" ] || "$KILN" synth --preset bloom-560m --dtype fp16 -o "$dir" >>"$LOG" 2>&1
[ -f "$plan" ] || "$KILN" build --model "$dir" --device cuda --precision fp16 \
  --max-input-tokens 512 --max-step-tokens 8192 -o "$plan" >>"$LOG" 2>&1
for round in $(seq "$ROUNDS"); do
  for variant in before after; do
    bin=$KILN url=""
    [ "$variant" = before ] && bin=$BEFORE
    "$bin" serve --plan "$plan" --name m --http-port 0 --grpc-port -1 --metrics-port 0 \
      --max-batch 64 --http-threads 256 >"$OUT/serve.out" 2>"$OUT/serve.err" &
    pid=$!
    for _ in $(seq 1 2000); do
      [ -z "$url" ] && url=$(sed -n 's|^kiln serve: HTTP on \(http://[^ ]*\).*|\1|p' "$OUT/serve.out")
      [ -n "$url" ] && [ "$(curl -s -o /dev/null -w '%{http_code}' "$url/v2/health/ready")" = 200 ] && break
      sleep 0.005
    done
    echo "== round $round $variant" | tee -a "$LOG"
    "$KILN" perf --url "$url" --model m --prompt-len 28 --output-len 100 --ignore-eos --stream \
      --concurrency 64 --duration "$DUR" --warmup 2 2>&1 | grep -E "concurrency|first token|inter-token" | tee -a "$LOG"
    kill -TERM "$pid"
    wait "$pid"
  done
done
