#!/bin/bash
# Which kernel path a quantized CUDA Linear should take, by the backend's switches, on one
# `kiln synth` bloom-560m: int8-weight decode at batch 1 on the int8 GEMV (default), on the
# skinny tensor-core GEMM (KILN_CUDA_I8_GEMV_ROWS=0) and with other GEMV warp counts
# (KILN_CUDA_GEMV_WARPS); fp8 decode at batch 1, 8 and 16 with the GEMV up to 8 rows (default),
# up to 32 (KILN_CUDA_W8A8_GEMV_ROWS=32, the default before 2026-12-08) and never
# (KILN_CUDA_GEMV=0: cuBLASLt's FP8 GEMM; the int8 lm_head then leaves its GEMV too). `kiln bench` medians, one line per configuration, in
# $OUT/quant_paths_ab.log. Run from the folder scripts/device/pack.sh filled.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}
source "$HERE/bundle_env.sh"
LOG="$OUT/quant_paths_ab.log"
mkdir -p /tmp/synth /tmp/plans
dir=/tmp/synth/bloom-560m
[ -d "$dir" ] || "$KILN" synth --preset bloom-560m --dtype fp16 -o "$dir" >>"$LOG" 2>&1
head -n 32 "$HERE/x/fixtures/data/calib.jsonl" >/tmp/calib32.jsonl
"$KILN" build --model "$dir" --device cuda --precision int8-weight --max-input-tokens 512 \
  -o /tmp/plans/ab-i8w.plan >>"$LOG" 2>&1 || echo "int8-weight build failed" | tee -a "$LOG"
"$KILN" build --model "$dir" --device cuda --precision fp8 --max-input-tokens 512 \
  --calib /tmp/calib32.jsonl --quant-tolerance off -o /tmp/plans/ab-fp8.plan >>"$LOG" 2>&1 ||
  echo "fp8 build failed" | tee -a "$LOG"
run() {  # run LABEL PLAN BATCHES [VAR=value ...]
  local label=$1 plan=$2 batches=$3
  shift 3
  env "$@" "$KILN" bench --plan "$plan" --input-len 78 --output-len 48 --runs 2 \
    --sweep batch="$batches" --json 2>>"$LOG" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print("%-40s batch %-3s decode %.3f ms/token  roofline %.1f %%" % (
        sys.argv[1], r["batch"], r["decode_ms_per_token"], r["roofline_pct"]))' "$label" |
    tee -a "$LOG"
}
run "int8-weight default" /tmp/plans/ab-i8w.plan 1
run "int8-weight I8_GEMV_ROWS=0 (skinny)" /tmp/plans/ab-i8w.plan 1 KILN_CUDA_I8_GEMV_ROWS=0
run "int8-weight GEMV_WARPS=32" /tmp/plans/ab-i8w.plan 1 KILN_CUDA_GEMV_WARPS=32
run "int8-weight GEMV_WARPS=8" /tmp/plans/ab-i8w.plan 1 KILN_CUDA_GEMV_WARPS=8
run "fp8 default" /tmp/plans/ab-fp8.plan 1,8,16
run "fp8 W8A8_GEMV_ROWS=32" /tmp/plans/ab-fp8.plan 8,16 KILN_CUDA_W8A8_GEMV_ROWS=32
run "fp8 GEMV=0 (cublaslt fp8 gemm)" /tmp/plans/ab-fp8.plan 1,8,16 KILN_CUDA_GEMV=0
