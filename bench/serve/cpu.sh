#!/usr/bin/env bash
# Continuous batching on the CPU: one kiln serve of a real-size plan (kiln synth), 32 concurrent
# streaming clients (kiln perf), the server stepping up to 32 sequences together against the
# same server limited to one running request (--max-batch 1: one request at a time, the others
# queued). Writes bench/serve/cpu-<preset>-<date>.json (both kiln perf runs) and prints a table.
# Benchmarks are only meaningful on a quiet machine: nothing else should be running.
# The window must hold several rounds of requests (kiln perf counts those that end inside it):
# 32 clients that start together stay in step, each round taking the prefill of 32 prompts
# (about 500 prompt tokens/s on 2 cores) plus N decode steps.
# Usage: [PRECISION=fp32] [DUR=90] [N=128] [PROMPT_LEN=32] bench/serve/cpu.sh [KILN] [WORKDIR] [PRESET]
set -euo pipefail
kiln=$(realpath "${1:-build/kiln}")
work="${2:-/tmp/kiln-bench}"
preset="${3:-bloom-560m}"
prec="${PRECISION:-fp32}"
dur="${DUR:-90}"
n="${N:-128}"
plen="${PROMPT_LEN:-32}"
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$work"
[ -f "$work/$preset/model.safetensors" ] || "$kiln" -q synth --preset "$preset" -o "$work/$preset"
plan="$work/$preset-$prec-serve.plan"
[ -f "$plan" ] || "$kiln" -q build --model "$work/$preset" --precision "$prec" -o "$plan"
run() {  # max_batch -> kiln perf JSON on stdout
  local out="$work/serve-$1.out"
  "$kiln" serve --plan "$plan" --name m --http-port 0 --grpc-port -1 --metrics-port -1 \
    --max-batch "$1" > "$out" 2> "$work/serve-$1.err" &
  local pid=$! url=""
  for _ in $(seq 1 600); do
    url=$(sed -n 's|^kiln serve: HTTP on \(http://[^ ]*\).*|\1|p' "$out")
    [ -n "$url" ] && grep -q "ready" "$out" && break
    sleep 0.1
  done
  "$kiln" perf --url "$url" --model m --prompt-len "$plen" --output-len "$n" --ignore-eos --stream \
    --concurrency 32 --duration "$dur" --warmup 5 --json
  kill -TERM "$pid"
  wait "$pid"
}
batched=$(run 32)
single=$(run 1)
stamp=$(date -u +%Y-%m-%d)
python3 - "$here/cpu-$preset-$prec-$stamp.json" "$preset" "$prec" "$n" "$batched" "$single" "$plen" <<'PY'
import json, platform, sys
path, preset, prec, n, batched, single, plen = sys.argv[1:8]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
res = {"preset": preset, "precision": prec, "prompt_words": int(plen), "output_len": int(n), "cpu": cpu,
       "continuous_batching": json.loads(batched), "max_batch_1": json.loads(single)}
json.dump(res, open(path, "w"), indent=1)
b = res["continuous_batching"]["results"][0]
s = res["max_batch_1"]["results"][0]
print(f"{preset} {prec} on {cpu}, 32 streaming clients, prompts of {plen} words, {n} output tokens each")
print("| server | output tok/s | requests/s | TTFT p50 / p99 ms | ITL p50 / p99 ms | errors |")
print("|---|---|---|---|---|---|")
for name, r in (("continuous batching (--max-batch 32)", b), ("one request at a time (--max-batch 1)", s)):
    print(f"| {name} | {r['output_tokens_per_s']:.1f} | {r['requests_per_s']:.2f} | "
          f"{r['ttft_ms_p50']:.0f} / {r['ttft_ms_p99']:.0f} | {r['itl_ms_p50']:.1f} / {r['itl_ms_p99']:.1f} | {r['errors']} |")
print(f"\ncontinuous batching: {b['output_tokens_per_s'] / s['output_tokens_per_s']:.1f}x the output tokens/s")
PY
