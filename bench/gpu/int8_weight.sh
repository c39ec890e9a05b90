#!/bin/bash
# CUDA int8-weight (and int4-weight) plans against fp16 plans of the same `kiln synth` weights, in
# one device run:
# plan size, `kiln bench` decode (ms/token, % of the memory roofline) at batch 1, 16 and 64 and
# the time to first token, and the agreement of the two plans' greedy tokens (`kiln eval
# --compare` on the fixture dataset: the weights are random, so the accuracies mean nothing, but
# the top-1 agreement says how far int8 weights move the next-token choice). bloom-560m (fp16
# checkpoint) and flan-t5-large (fp32 checkpoint). Logs and JSON lines in $OUT.
# Run from the folder scripts/device/pack.sh filled. Usage: int8_weight.sh [RUNS]
# (PRECISIONS="fp16 int8-weight int4-weight" and MODELS="bloom-560m flan-t5-large" by default;
# int8 and fp8 plans are calibrated on 32 of the fixtures' calibration prompts, on this machine's
# CPU, without the sensitivity fallback; SKINNY_AB=1 adds the batch-16 run without the skinny
# GEMM; PREFILL=1 adds a prefill of 16 prompts of 512 tokens per plan (time to first token).)
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}
RUNS=${1:-3}
source "$HERE/bundle_env.sh"
LOG="$OUT/int8_weight.log"
JSON="$OUT/int8_weight.jsonl"
mkdir -p /tmp/synth /tmp/plans
date -u | tee "$LOG"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee -a "$LOG"
for preset in ${MODELS:-bloom-560m flan-t5-large}; do
  case "$preset" in
    bloom-*) sdtype=fp16 ;;
    *) sdtype=fp32 ;;
  esac
  dir=/tmp/synth/$preset
  [ -d "$dir" ] || "$KILN" synth --preset "$preset" --dtype "$sdtype" -o "$dir" >>"$LOG" 2>&1
  for prec in ${PRECISIONS:-fp16 int8-weight int4-weight}; do
    plan=/tmp/plans/$preset-$prec.plan
    calib=()
    case "$prec" in
      int8 | fp8)
        head -n 32 "$HERE/x/fixtures/data/calib.jsonl" >/tmp/calib32.jsonl
        calib=(--calib /tmp/calib32.jsonl --quant-tolerance off)
        ;;
    esac
    "$KILN" build --model "$dir" --device cuda --precision "$prec" --max-input-tokens 512 \
      "${calib[@]}" -o "$plan" >>"$LOG" 2>&1 ||
      { echo "build $preset $prec failed" | tee -a "$LOG"; continue; }
    echo "$preset $prec plan: $(stat -c %s "$plan") bytes" | tee -a "$LOG"
    "$KILN" bench --plan "$plan" --input-len 78 --output-len 100 --runs "$RUNS" \
      --sweep batch=1,16,64 --json 2>>"$LOG" | tee -a "$JSON" |
      python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print("  batch %-3s decode %.3f ms/token  roofline %.1f %%  ttft %.2f ms" % (
        r.get("batch"), r.get("decode_ms_per_token", float("nan")), r.get("roofline_pct", float("nan")),
        r.get("ttft_ms", float("nan"))))' | tee -a "$LOG"
    if [ -n "${PREFILL:-}" ]; then
      "$KILN" bench --plan "$plan" --input-len 512 --output-len 2 --runs "$RUNS" \
        --sweep batch=16 --json 2>>"$LOG" | sed 's/^{/{"prefill": 1, /' | tee -a "$JSON" |
        python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print("  prefill 16 x 512: ttft %.2f ms" % r.get("ttft_ms", float("nan")))' | tee -a "$LOG"
    fi
  done
  # Batched steps of 16 rows on widened weights and cuBLASLt instead of the skinny GEMM.
  if [ -n "${SKINNY_AB:-}" ]; then
    echo "$preset int8-weight, KILN_CUDA_SKINNY_ROWS=0:" | tee -a "$LOG"
    KILN_CUDA_SKINNY_ROWS=0 "$KILN" bench --plan "/tmp/plans/$preset-int8-weight.plan" \
      --input-len 78 --output-len 100 --runs "$RUNS" --sweep batch=16 --json 2>>"$LOG" |
      sed 's/^{/{"skinny_rows": 0, /' | tee -a "$JSON" | tee -a "$LOG"
  fi
  for prec in ${PRECISIONS:-fp16 int8-weight int4-weight}; do
    [ "$prec" = fp16 ] || [ ! -f "/tmp/plans/$preset-$prec.plan" ] ||
      "$KILN" eval --compare "/tmp/plans/$preset-fp16.plan" "/tmp/plans/$preset-$prec.plan" \
        --dataset "$HERE/x/fixtures/data/dev.jsonl" --max-new-tokens 8 --json 2>>"$LOG" |
      tee -a "$JSON" | tee -a "$LOG"
  done
done
