#!/usr/bin/env bash
# Regenerates the README's CPU results: synthesizes real-size checkpoints (kiln synth), builds
# plans at each precision in $PRECISIONS (default "fp32 bf16 int8-weight") and runs `kiln bench`
# at batch 1, 4 and 16 (prompt 78 tokens, 100 new tokens, EOS ignored), with the machine's read
# bandwidth measured in the same run. Writes bench/results/cpu-<model>.jsonl and prints a
# markdown table. Usage: bench/cpu/run.sh [KILN] [WORKDIR] [PRESET...]
# (defaults: build/kiln, /tmp/kiln-bench, flan-t5-base bloom-560m).
# Benchmarks are only meaningful on a quiet machine: nothing else should be running.
set -euo pipefail
kiln="${1:-build/kiln}"
work="${2:-/tmp/kiln-bench}"
shift $(( $# > 2 ? 2 : $# ))
presets=("$@")
[ ${#presets[@]} -gt 0 ] || presets=(flan-t5-base bloom-560m)
out="$(dirname "$0")/../results"
mkdir -p "$work" "$out"
for p in "${presets[@]}"; do
  [ -f "$work/$p/model.safetensors" ] || "$kiln" -q synth --preset "$p" -o "$work/$p"
  : > "$out/cpu-$p.jsonl"
  for prec in ${PRECISIONS:-fp32 bf16 int8-weight}; do
    plan="$work/$p-$prec.plan"
    [ -f "$plan" ] || "$kiln" -q build --model "$work/$p" --precision "$prec" -o "$plan"
    "$kiln" bench --plan "$plan" --input-len 78 --output-len 100 --warmup 1 --runs 3 \
      --sweep batch=1,4,16 --json >> "$out/cpu-$p.jsonl"
  done
done
python3 - "$out" "${presets[@]}" <<'PY'
import json, sys
out, presets = sys.argv[1], sys.argv[2:]
print("| model | precision | batch | load ms | TTFT ms | ms/token | tokens/s | prefill tok/s | % roofline | bandwidth GB/s |")
print("|---|---|---|---|---|---|---|---|---|---|")
for p in presets:
    for line in open(f"{out}/cpu-{p}.jsonl"):
        r = json.loads(line)
        print(f"| {p} | {r['precision']} | {r['batch']} | {r['load_ms']:.0f} | {r['ttft_ms']:.1f} | "
              f"{r['decode_ms_per_token']:.2f} | {r['tokens_per_s']:.1f} | {r['prefill_tokens_per_s']:.0f} | "
              f"{r['roofline_pct']:.1f} | {r['bandwidth_gbps']:.1f} |")
PY
