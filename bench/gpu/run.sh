#!/bin/bash
# Everything on the GPU machine in one command: the CUDA tests, real-size checkpoints made by
# `kiln synth` (bloom-560m fp16, flan-t5-large), kiln plans, `kiln bench` and HuggingFace
# transformers (eager) on the same weights, logs and a JSON summary in $OUT; batch-1 A/B runs
# without CUDA graphs, without kiln's GEMV, without its wide one-row instance and without
# programmatic dependent launch (KILN_CUDA_GRAPHS=0, KILN_CUDA_GEMV=0, KILN_CUDA_GEMV_WIDE=0,
# KILN_CUDA_PDL=0) and without run-ahead (KILN_RUN_AHEAD=0), batch 16 without the skinny GEMM
# (KILN_CUDA_SKINNY_ROWS=0), and each step's GPU time; the
# real-size logits check against HF fp32 (bench/gpu/hf_real_logits.py + the CudaRealSize test);
# plans built with --no-tune (build-time tactic selection off); a long-context run with and
# without split-sequence attention (KILN_CUDA_SPLIT=0).
# Run from the folder scripts/device/pack.sh filled (binaries and fixtures in bundle.tar.xz).
# --ncu: also every kernel of a short batch-1 run timed by Nsight Compute (ncu_summary.py).
# Usage: run.sh [--no-tests] [--no-hf] [--ncu] [--runs N] [--batches "1 16 64"]
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}
RUNS=3
BATCHES="1 16 64"
TESTS=1
HF=1
NCU=0
while [ $# -gt 0 ]; do
  case "$1" in
    --no-tests) TESTS=0 ;;
    --no-hf) HF=0 ;;
    --ncu) NCU=1 ;;
    --runs) RUNS=$2; shift ;;
    --batches) BATCHES=$2; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p /tmp/synth /tmp/plans
source "$HERE/bundle_env.sh"
LOG="$OUT/run.log"
date -u | tee "$LOG"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$LOG"
"$KILN" --version | tee -a "$LOG"
if [ "$TESTS" = 1 ]; then
  bash "$HERE/cuda_tests.sh" >>"$LOG" 2>&1
  # HF on the scaled T5 the fp16-overflow test left behind.
  scaled=$(find / -type d -name fp16_overflow_t5 -not -path '/proc/*' 2>/dev/null | head -1)
  [ -n "$scaled" ] && python3 "$HERE/hf_overflow_check.py" "$scaled" 2>&1 | grep "^HF" >>"$LOG"
fi

SWEEP="batch=$(echo $BATCHES | tr ' ' ',')"
bench_model() {  # preset family synth-dtype precision
  local preset=$1 family=$2 sdtype=$3 prec=$4 dir=/tmp/synth/$1
  [ -d "$dir" ] || "$KILN" synth --preset "$preset" --dtype "$sdtype" -o "$dir" >>"$LOG" 2>&1
  local plan=/tmp/plans/$preset-$prec.plan
  "$KILN" build --model "$dir" --device cuda --precision "$prec" --max-input-tokens 128 \
    --max-step-tokens 8192 -o "$plan" >>"$LOG" 2>&1 || { echo "build $preset $prec failed" | tee -a "$LOG"; return; }
  "$KILN" bench --plan "$plan" --input-len 78 --output-len 100 --runs "$RUNS" --sweep "$SWEEP" \
    --json >"$OUT/kiln-$preset-$prec.jsonl" 2>>"$LOG" || echo "bench $preset $prec failed" | tee -a "$LOG"
  cat "$OUT/kiln-$preset-$prec.jsonl" >>"$LOG"
  # What each decode-step change is worth at batch 1: without CUDA graphs, without the GEMV,
  # without programmatic dependent launch, without the scheduler's run-ahead.
  for ab in KILN_CUDA_GRAPHS KILN_CUDA_GEMV KILN_CUDA_GEMV_WIDE KILN_CUDA_PDL KILN_RUN_AHEAD; do
    echo "== A/B $preset $prec batch 1 with $ab=0" >>"$LOG"
    env "$ab=0" "$KILN" bench --plan "$plan" --input-len 78 --output-len 100 --runs "$RUNS" \
      --batch 1 2>&1 | grep -E "^ +[0-9]" >>"$LOG"
  done
  # The skinny GEMM's worth at batch 16: its rows on cuBLASLt instead.
  echo "== A/B $preset $prec batch 16 with KILN_CUDA_SKINNY_ROWS=0" >>"$LOG"
  KILN_CUDA_SKINNY_ROWS=0 "$KILN" bench --plan "$plan" --input-len 78 --output-len 100 \
    --runs "$RUNS" --batch 16 2>&1 | grep -E "^ +[0-9]" >>"$LOG"
  # A decode step's GPU time (CUDA events around its graph launch) beside the wall time.
  echo "== step profile $preset $prec batch 1" >>"$LOG"
  KILN_CUDA_PROFILE=steps "$KILN" -v bench --plan "$plan" --input-len 78 --output-len 100 \
    --runs "$RUNS" --batch 1 2>&1 | grep -E "step profile" >>"$LOG"
  # What build-time tactic selection is worth: the same plan built with --no-tune.
  "$KILN" build --model "$dir" --device cuda --precision "$prec" --max-input-tokens 128 \
    --max-step-tokens 8192 --no-tune -o "$plan.notune" >/dev/null 2>&1 &&
    for b in 1 ${BATCHES##* }; do
      echo "== A/B $preset $prec batch $b built with --no-tune" >>"$LOG"
      "$KILN" bench --plan "$plan.notune" --input-len 78 --output-len 100 --runs "$RUNS" \
        --batch "$b" 2>&1 | grep -E "^ +[0-9]" >>"$LOG"
    done
  # Where the time goes: every node timed with CUDA events (batch 1 and the largest batch).
  for b in 1 ${BATCHES##* }; do
    echo "== profile $preset $prec batch $b" >>"$LOG"
    KILN_CUDA_PROFILE=1 "$KILN" -v bench --plan "$plan" --input-len 78 --output-len 100 \
      --runs 1 --warmup 1 --batch "$b" 2>&1 | grep -E "cuda profile|ms/step|roofline|^ +[0-9]" >>"$LOG"
  done
  if [ "$NCU" = 1 ] && command -v ncu >/dev/null; then
    echo "== ncu $preset $prec batch 1 (prompt 78, 16 new tokens)" >>"$LOG"
    ncu --csv --clock-control none --cache-control none --metrics gpu__time_duration.sum "$KILN" bench --plan "$plan" --input-len 78 \
      --output-len 16 --runs 1 --warmup 0 --batch 1 >"$OUT/ncu-$preset.csv" 2>/dev/null
    python3 "$HERE/ncu_summary.py" "$OUT/ncu-$preset.csv" 15 >>"$LOG" 2>&1
  fi
  [ "$HF" = 1 ] || return 0
  python3 "$HERE/hf_baseline.py" "$dir" "$family" "$prec" 78 100 "$RUNS" $BATCHES \
    >"$OUT/hf-$preset-$prec.jsonl" 2>>"$LOG" || echo "HF $preset $prec failed" | tee -a "$LOG"
  cat "$OUT/hf-$preset-$prec.jsonl" >>"$LOG"
}
bench_model bloom-560m bloom fp16 fp16
bench_model flan-t5-large t5 fp32 bf16
# Split-sequence decode attention over a long context: bloom-560m batch 1, prompt 3000.
"$KILN" build --model /tmp/synth/bloom-560m --device cuda --precision fp16 \
  --max-input-tokens 3200 -o /tmp/plans/bloom-long.plan >>"$LOG" 2>&1 &&
  for split in 1 0; do
    echo "== bloom-560m fp16 batch 1, prompt 3000, 100 new tokens, KILN_CUDA_SPLIT=$split" >>"$LOG"
    KILN_CUDA_SPLIT=$split "$KILN" bench --plan /tmp/plans/bloom-long.plan --input-len 3000 \
      --output-len 100 --runs "$RUNS" --batch 1 2>&1 | grep -E "^ +[0-9]" >>"$LOG"
  done
# Real sizes against HF fp32 on the same weights: fp32 logits within 1e-3, fp16/bf16 cosine.
if [ "$TESTS" = 1 ]; then
  echo "== real-size logits against HF fp32" >>"$LOG"
  python3 "$HERE/hf_real_logits.py" /tmp/hfref 78 /tmp/synth/bloom-560m bloom \
    /tmp/synth/flan-t5-large t5 >>"$LOG" 2>&1 &&
    KILN_HF_REAL_SIZE=/tmp/hfref TESTLOG=real_size_tests.log bash "$HERE/cuda_tests.sh" 'CudaRealSize*' >>"$LOG" 2>&1
  grep -h "\[real-size\]" "$OUT/real_size_tests.log" >>"$LOG"
fi
python3 "$HERE/summarize.py" "$OUT" | tee -a "$LOG"
