#!/usr/bin/env bash
# Regenerates the README's CPU results: synthesizes real-size checkpoints (kiln synth), builds a
# plan per precision and runs `kiln bench` at batch 1, 4 and 16 (prompt 78 tokens, N new tokens,
# a warm-up and the median of 3 runs), with the machine's read bandwidth measured in the same
# run. Writes bench/results/cpu-<model>.jsonl (one line per precision and batch) and prints a
# markdown table.
# Usage: [PRECISIONS="fp32 bf16 int8-weight"] [N=100] [BATCHES=1,4,16] [APPEND=1] bench/cpu/run.sh [KILN] [WORKDIR] [PRESET...]
# (APPEND=1 adds to the .jsonl files instead of starting them afresh: one precision per call.)
# (defaults: build/kiln, /tmp/kiln-bench, flan-t5-base bloom-560m).
# Benchmarks are only meaningful on a quiet machine: nothing else should be running.
set -euo pipefail
kiln="${1:-build/kiln}"
work="${2:-/tmp/kiln-bench}"
shift $(( $# > 2 ? 2 : $# ))
presets=("$@")
[ ${#presets[@]} -gt 0 ] || presets=(flan-t5-base bloom-560m)
read -r -a precisions <<< "${PRECISIONS:-fp32 bf16 int8-weight}"
new_tokens="${N:-100}"
out="$(dirname "$0")/../results"
mkdir -p "$work" "$out"
for p in "${presets[@]}"; do
  [ -f "$work/$p/model.safetensors" ] || "$kiln" -q synth --preset "$p" -o "$work/$p"
  [ -n "${APPEND:-}" ] || : > "$out/cpu-$p.jsonl"
  for prec in "${precisions[@]}"; do
    plan="$work/$p-$prec.plan"
    [ -f "$plan" ] || "$kiln" -q build --model "$work/$p" --precision "$prec" -o "$plan"
    "$kiln" bench --plan "$plan" --input-len 78 --output-len "$new_tokens" --warmup 1 --runs 3 \
      --sweep "batch=${BATCHES:-1,4,16}" --json >> "$out/cpu-$p.jsonl"
  done
done
python3 - "$out" "${presets[@]}" <<'PY'
import json, sys
out, presets = sys.argv[1], sys.argv[2:]
print("| model | precision | batch | TTFT ms | ms/token | tokens/s | prefill tok/s | MB/step | % roofline | bandwidth GB/s |")
print("|---|---|---|---|---|---|---|---|---|---|")
for p in presets:
    for line in open(f"{out}/cpu-{p}.jsonl"):
        r = json.loads(line)
        print(f"| {p} | {r['precision']} | {r['batch']} | {r['ttft_ms']:.0f} | "
              f"{r['decode_ms_per_token']:.1f} | {r['tokens_per_s']:.1f} | {r['prefill_tokens_per_s']:.0f} | "
              f"{r['bytes_per_step'] / 1e6:.0f} | {r['roofline_pct']:.1f} | {r['bandwidth_gbps']:.1f} |")
PY
