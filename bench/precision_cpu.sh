#!/usr/bin/env bash
# Decode speed and plan size per CPU precision at real size: synthesizes flan-t5-small and
# bloom-560m (random weights, the public shapes), builds an fp32, fp16, bf16, int8-weight and
# int4-weight plan of each, and runs `kiln bench` (batch 1, 78 prompt tokens, 32 new tokens) over the precisions
# in rotation for ROUNDS rounds, so that load from other processes falls on every precision
# alike. Prints one line per (model, precision): the median over rounds of each round's median
# decode ms/token and of its % of roofline (bytes per step at the stored precision / step time /
# the bandwidth kiln measured in that same run), the plan size and its ratio to the first
# precision's (fp32 unless PRECISIONS says otherwise).
#
# Usage: [PRESETS="bloom-560m"] [PRECISIONS="bf16 int8-weight int4-weight"] \
#        bench/precision_cpu.sh [KILN] [WORKDIR] [ROUNDS]
set -euo pipefail
KILN="${1:-build/kiln}"
WORK="${2:-/tmp/kiln-precision-bench}"
ROUNDS="${3:-3}"
read -r -a PRECISIONS <<< "${PRECISIONS:-fp32 fp16 bf16 int8-weight int4-weight}"
read -r -a PRESETS <<< "${PRESETS:-flan-t5-small bloom-560m}"
mkdir -p "$WORK"

for preset in "${PRESETS[@]}"; do
  [ -f "$WORK/$preset/config.json" ] || "$KILN" synth --preset "$preset" -o "$WORK/$preset" --seed 1 >/dev/null
  opts=()
  [ "$preset" = bloom-560m ] && opts=(--prompt-template "{prompt} =")
  for p in "${PRECISIONS[@]}"; do
    [ -f "$WORK/$preset-$p.plan" ] ||
      "$KILN" -q build --model "$WORK/$preset" "${opts[@]}" --precision "$p" -o "$WORK/$preset-$p.plan"
  done
done

: > "$WORK/runs.jsonl"
for round in $(seq "$ROUNDS"); do
  for preset in "${PRESETS[@]}"; do
    for p in "${PRECISIONS[@]}"; do
      "$KILN" -q bench --plan "$WORK/$preset-$p.plan" --batch 1 --input-len 78 --output-len 32 \
        --warmup 1 --runs 3 --json | sed "s/^{/{\"round\":$round,\"preset\":\"$preset\",\"plan_bytes\":$(stat -L -c %s "$WORK/$preset-$p.plan"),/" >> "$WORK/runs.jsonl"
    done
  done
done

python3 - "$WORK/runs.jsonl" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
first = runs[0]["precision"]
print(f"{'model':<14} {'precision':<12} {'decode ms/token':>16} {'vs ' + first:>8} {'roofline %':>11} "
      f"{'MB/step':>8} {'plan MiB':>9} {'vs ' + first:>8}  (median of {max(r['round'] for r in runs)} rounds)")
for preset in dict.fromkeys(r["preset"] for r in runs):
    rows = {}
    for p in dict.fromkeys(r["precision"] for r in runs if r["preset"] == preset):
        rs = [r for r in runs if r["preset"] == preset and r["precision"] == p]
        rows[p] = (statistics.median(r["decode_ms_per_token"] for r in rs),
                   statistics.median(r["roofline_pct"] for r in rs),
                   rs[0]["bytes_per_step"], rs[0]["plan_bytes"])
    ms32, _, _, size32 = rows[first]
    for p, (ms, roof, step_bytes, size) in rows.items():
        print(f"{preset:<14} {p:<12} {ms:>16.1f} {ms / ms32:>8.2f} {roof:>11.1f} "
              f"{step_bytes / 1e6:>8.1f} {size / 2**20:>9.1f} {size / size32:>8.3f}")
PY
