#!/usr/bin/env bash
# Batch-1 decode of two kiln binaries side by side (before/after a change), interleaved per plan
# so both see the same state of this VM's memory bandwidth: for each round, model and precision,
# `kiln bench --input-len 78 --output-len N --warmup 1 --runs 3 --json` with BEFORE, then AFTER.
# Plans come from bench/cpu/run.sh's WORKDIR (<model>-<precision>.plan); AFTER_WORK names another
# such directory for AFTER's plans when the change is in the plans (a graph pass). Writes
# bench/results/cpu-batch1-ab.jsonl (OUT overrides; each line tagged with variant and round) and
# prints a table. With LOCK, each benchmark holds an exclusive flock on that file (other jobs on
# this shared machine take it shared).
# Usage: [ROUNDS=2] [N=64] [PRECISIONS="fp32 bf16 int8-weight"] [AFTER_WORK=DIR] [OUT=FILE]
#        [LOCK=/tmp/kiln-quiet.lock] bench/cpu/ab_batch1.sh BEFORE_KILN AFTER_KILN WORKDIR [PRESET...]
set -euo pipefail
before="$1" after="$2" work="$3"
shift 3
presets=("$@")
[ ${#presets[@]} -gt 0 ] || presets=(bloom-560m flan-t5-base)
out="${OUT:-$(dirname "$0")/../results/cpu-batch1-ab.jsonl}"
read -r -a precisions <<< "${PRECISIONS:-fp32 bf16 int8-weight}"
: > "$out"
for round in $(seq "${ROUNDS:-2}"); do
  for p in "${presets[@]}"; do
    for prec in "${precisions[@]}"; do
      for variant in before after; do
        kiln="$before" dir="$work"
        [ "$variant" = after ] && kiln="$after" dir="${AFTER_WORK:-$work}"
        cmd=("$kiln" bench --plan "$dir/$p-$prec.plan" --input-len 78 --output-len "${N:-64}"
          --warmup 1 --runs 3 --json)
        [ -n "${LOCK:-}" ] && cmd=(flock -x "$LOCK" "${cmd[@]}")
        "${cmd[@]}" |
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
