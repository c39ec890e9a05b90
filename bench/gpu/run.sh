#!/bin/bash
# Everything on the GPU machine in one command: the CUDA tests, real-size checkpoints made by
# `kiln synth` (bloom-560m fp16, flan-t5-large), kiln plans, `kiln bench` and HuggingFace
# transformers (eager) on the same weights, logs and a JSON summary in $OUT.
# Run from the folder scripts/device/pack.sh filled (binaries and fixtures in bundle.tar.xz).
# Usage: run.sh [--no-tests] [--runs N] [--batches "1 16 64"]
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}
RUNS=3
BATCHES="1 16 64"
TESTS=1
while [ $# -gt 0 ]; do
  case "$1" in
    --no-tests) TESTS=0 ;;
    --runs) RUNS=$2; shift ;;
    --batches) BATCHES=$2; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
mkdir -p "$OUT" "$HERE/x" /tmp/synth /tmp/plans
[ -x "$HERE/x/bin/kiln" ] || tar -C "$HERE/x" -xJf "$HERE/bundle.tar.xz"
CUBLAS_DIR=$(dirname "$(find / -name 'libcublasLt.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="$HERE/x/lib:/usr/local/cuda/lib64:$CUBLAS_DIR:${LD_LIBRARY_PATH:-}"
KILN="$HERE/x/bin/kiln"
LOG="$OUT/run.log"
date -u | tee "$LOG"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee -a "$LOG"
"$KILN" --version | tee -a "$LOG"
[ "$TESTS" = 1 ] && bash "$HERE/cuda_tests.sh" >>"$LOG" 2>&1

SWEEP="batch=$(echo $BATCHES | tr ' ' ',')"
bench_model() {  # preset family synth-dtype precision
  local preset=$1 family=$2 sdtype=$3 prec=$4 dir=/tmp/synth/$1
  [ -d "$dir" ] || "$KILN" synth --preset "$preset" --dtype "$sdtype" -o "$dir" >>"$LOG" 2>&1
  local plan=/tmp/plans/$preset-$prec.plan
  "$KILN" build --model "$dir" --device cuda --precision "$prec" --max-input-tokens 128 \
    -o "$plan" >>"$LOG" 2>&1 || { echo "build $preset $prec failed" | tee -a "$LOG"; return; }
  "$KILN" bench --plan "$plan" --input-len 78 --output-len 100 --runs "$RUNS" --sweep "$SWEEP" \
    --json >"$OUT/kiln-$preset-$prec.jsonl" 2>>"$LOG" || echo "bench $preset $prec failed" | tee -a "$LOG"
  cat "$OUT/kiln-$preset-$prec.jsonl" >>"$LOG"
  # Where the time goes: every node timed with CUDA events (batch 1 and the largest batch).
  for b in 1 ${BATCHES##* }; do
    echo "== profile $preset $prec batch $b" >>"$LOG"
    KILN_CUDA_PROFILE=1 "$KILN" -v bench --plan "$plan" --input-len 78 --output-len 100 \
      --runs 1 --warmup 1 --batch "$b" 2>&1 | grep -E "cuda profile|ms/step|roofline|^ +[0-9]" >>"$LOG"
  done
  python3 "$HERE/hf_baseline.py" "$dir" "$family" "$prec" 78 100 "$RUNS" $BATCHES \
    >"$OUT/hf-$preset-$prec.jsonl" 2>>"$LOG" || echo "HF $preset $prec failed" | tee -a "$LOG"
  cat "$OUT/hf-$preset-$prec.jsonl" >>"$LOG"
}
bench_model bloom-560m bloom fp16 fp16
bench_model flan-t5-large t5 fp32 bf16
python3 "$HERE/summarize.py" "$OUT" | tee -a "$LOG"
