#!/usr/bin/env bash
# Batch 1 and batch 16 decode of two kiln binaries side by side (before/after a change),
# interleaved per plan so both see the same state of this VM's memory bandwidth: for each round,
# model and precision, `kiln bench --input-len 78 --output-len N --warmup 1 --runs 3 --sweep
# batch=1,16 --json` with BEFORE, then AFTER, each under an exclusive hold of LOCK (other jobs on
# the machine wait on it) when set. Plans come from bench/cpu/run.sh's WORKDIR
# (<model>-<precision>.plan). Writes OUT (default bench/results/cpu-batch16-ab.jsonl; each line
# tagged with variant and round) and prints a table with each binary's batch-16 / batch-1
# tokens/s ratio.
# Usage: [ROUNDS=2] [N=64] [PRECISIONS="bf16"] [LOCK=/tmp/kiln-quiet.lock] [OUT=FILE]
#        bench/cpu/ab_batch16.sh BEFORE_KILN AFTER_KILN WORKDIR [PRESET...]
set -euo pipefail
before="$1" after="$2" work="$3"
shift 3
presets=("$@")
[ ${#presets[@]} -gt 0 ] || presets=(bloom-560m flan-t5-base)
out="${OUT:-$(dirname "$0")/../results/cpu-batch16-ab.jsonl}"
: > "$out"
for round in $(seq "${ROUNDS:-2}"); do
  for p in "${presets[@]}"; do
    for prec in ${PRECISIONS:-bf16}; do
      for variant in before after; do
        kiln="$before"
        [ "$variant" = after ] && kiln="$after"
        cmd=("$kiln" bench --plan "$work/$p-$prec.plan" --input-len 78 --output-len "${N:-64}"
          --warmup 1 --runs 3 --sweep batch=1,16 --json)
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
    runs[(r["preset"], r["precision"], r["round"], r["variant"])][r["batch"]] = r
print("| model | precision | round | variant | batch 1 ms/token | batch 16 ms/step | batch 1 tokens/s | batch 16 tokens/s | ratio | probe GB/s |")
print("|---|---|---|---|---|---|---|---|---|---|")
for (p, prec, rnd, var), b in runs.items():
    one, six = b[1], b[16]
    print(f"| {p} | {prec} | {rnd} | {var} | {one['decode_ms_per_token']:.2f} | "
          f"{six['decode_ms_per_token']:.2f} | {one['tokens_per_s']:.1f} | {six['tokens_per_s']:.1f} | "
          f"{six['tokens_per_s'] / one['tokens_per_s']:.2f}x | {one['bandwidth_gbps']:.1f} |")
PY
