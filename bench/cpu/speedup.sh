#!/usr/bin/env bash
# Issue 8's "speed-up over today's fp32 path, measured in the same run": for each model, the
# fp32 plan on the AVX2 kernels (KILN_CPU_ISA=avx2: the hand-written fp32 micro-kernels the CPU
# backend had before issue 8, still the path of CPUs without AVX-512; its plan built plain under
# the same setting) and then the AVX-512 plans of every precision, each `kiln bench --input-len
# 78 --output-len N --warmup 1 --runs 3 --sweep batch=1,16 --json`, interleaved for ROUNDS rounds
# so that all see the same state of the VM. Plans: WORKDIR/<model>-<precision>.plan and
# WORKDIR/<model>-fp32-avx2.plan (made here when missing, from WORKDIR/<model>/, a kiln synth
# checkpoint). Writes OUT (default bench/results/cpu-speedup.jsonl) and prints each
# configuration's speed-up in decode tokens/s and time to first token against the AVX2 fp32 plan
# of the same round.
# Usage: [ROUNDS=2] [N=32] [PRECISIONS="fp32 bf16 int8-weight"] [OUT=FILE]
#        bench/cpu/speedup.sh KILN WORKDIR [PRESET...]
set -euo pipefail
kiln="$1" work="$2"
shift 2
presets=("$@")
[ ${#presets[@]} -gt 0 ] || presets=(bloom-560m flan-t5-base)
out="${OUT:-$(dirname "$0")/../results/cpu-speedup.jsonl}"
: > "$out"
for p in "${presets[@]}"; do
  [ -f "$work/$p-fp32-avx2.plan" ] ||
    KILN_CPU_ISA=avx2 "$kiln" build --model "$work/$p" --precision fp32 -o "$work/$p-fp32-avx2.plan"
  for prec in ${PRECISIONS:-fp32 bf16 int8-weight}; do
    [ -f "$work/$p-$prec.plan" ] ||
      "$kiln" build --model "$work/$p" --precision "$prec" -o "$work/$p-$prec.plan"
  done
done
bench() {  # tag plan [env...]
  local tag=$1 plan=$2 round=$3
  shift 3
  env "$@" "$kiln" bench --plan "$plan" --input-len 78 --output-len "${N:-32}" --warmup 1 \
    --runs 3 --sweep batch=1,16 --json |
    sed "s/^{/{\"variant\":\"$tag\",\"round\":$round,\"preset\":\"$p\",/" >> "$out"
}
for round in $(seq "${ROUNDS:-2}"); do
  for p in "${presets[@]}"; do
    bench fp32-avx2 "$work/$p-fp32-avx2.plan" "$round" KILN_CPU_ISA=avx2
    for prec in ${PRECISIONS:-fp32 bf16 int8-weight}; do
      bench "$prec" "$work/$p-$prec.plan" "$round"
    done
  done
done
python3 - "$out" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
base = {(r["preset"], r["round"], r["batch"]): r for r in rows if r["variant"] == "fp32-avx2"}
print("| model | plan | round | batch | ms/token | tokens/s | speed-up | TTFT ms | TTFT speed-up |")
print("|---|---|---|---|---|---|---|---|---|")
for r in rows:
    b = base[(r["preset"], r["round"], r["batch"])]
    print(f"| {r['preset']} | {r['variant']} | {r['round']} | {r['batch']} | "
          f"{r['decode_ms_per_token']:.2f} | {r['tokens_per_s']:.1f} | "
          f"{r['tokens_per_s'] / b['tokens_per_s']:.2f}x | {r['ttft_ms']:.0f} | "
          f"{b['ttft_ms'] / r['ttft_ms']:.2f}x |")
PY
