#!/usr/bin/env bash
# Batch-1 decode of two kiln binaries side by side (before/after a change), interleaved per plan
# so both see the same state of this VM's memory bandwidth: for each round, model and precision,
# `kiln bench --input-len 78 --output-len N --warmup 1 --runs 3 --json` with BEFORE, then AFTER.
# Plans come from bench/cpu/run.sh's WORKDIR (<model>-<precision>.plan). Writes
# bench/results/cpu-batch1-ab.jsonl (each line tagged with variant and round) and prints a table.
# Usage: [ROUNDS=2] [N=64] bench/cpu/ab_batch1.sh BEFORE_KILN AFTER_KILN WORKDIR [PRESET...]
set -euo pipefail
before="$1" after="$2" work="$3"
shift 3
presets=("$@")
[ ${#presets[@]} -gt 0 ] || presets=(bloom-560m flan-t5-base)
out="$(dirname "$0")/../results/cpu-batch1-ab.jsonl"
: > "$out"
for round in $(seq "${ROUNDS:-2}"); do
  for p in "${presets[@]}"; do
    for prec in fp32 bf16 int8-weight; do
      for variant in before after; do
        kiln="$before"
        [ "$variant" = after ] && kiln="$after"
        "$kiln" bench --plan "$work/$p-$prec.plan" --input-len 78 --output-len "${N:-64}" \
          --warmup 1 --runs 3 --json |
          sed "s/^{/{\"variant\":\"$variant\",\"round\":$round,\"preset\":\"$p\",/" >> "$out"
      done
    done
  done
done
python3 - "$out" <<'PY'
import json, sys
from collections import defaultdict
runs = defaultdict(dict)
for line in open(sys.argv[1]):
    r = json.loads(line)
    runs[(r["preset"], r["precision"], r["round"])][r["variant"]] = r
print("| model | precision | round | before ms/token | after ms/token | speed-up | before % roofline | after % roofline | probe GB/s before / after |")
print("|---|---|---|---|---|---|---|---|---|")
for (p, prec, rnd), v in runs.items():
    b, a = v["before"], v["after"]
    print(f"| {p} | {prec} | {rnd} | {b['decode_ms_per_token']:.2f} | {a['decode_ms_per_token']:.2f} | "
          f"{b['decode_ms_per_token'] / a['decode_ms_per_token']:.2f}x | {b['roofline_pct']:.1f} | "
          f"{a['roofline_pct']:.1f} | {b['bandwidth_gbps']:.1f} / {a['bandwidth_gbps']:.1f} |")
PY
