#!/bin/bash
# On the GPU machine: issue 40's accuracy gate for the quantized CUDA plans of both fixture models.
# Each cuda plan (int8-weight, int4-weight, int8 W8A8 and fp8 calibrated on the fixtures'
# calibration prompts with the default sensitivity fallback) is compared with the cpu fp32 plan
# on the whole dev set by `kiln eval --compare --max-drop 0.02` (exit 1 when the candidate is more
# than two points below fp32), logs and JSON in $OUT/quant_accuracy.{log,jsonl}.
# Run from the folder scripts/device/pack.sh filled. Usage: quant_accuracy.sh
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}
source "$HERE/bundle_env.sh"
LOG="$OUT/quant_accuracy.log"
JSON="$OUT/quant_accuracy.jsonl"
ROOT=$(cd "$HERE/../.." && pwd)  # the working tree (models/ holds the fixture models)
DATA="$HERE/x/fixtures/data"
mkdir -p /tmp/qa
status=0
for model in t5-tiny bloom-tiny; do
  template=()
  [ "$model" = bloom-tiny ] && template=(--prompt-template "{prompt} =")
  "$KILN" build --model "$ROOT/models/$model" "${template[@]}" -o "/tmp/qa/$model-fp32.plan" \
    >>"$LOG" 2>&1 || { echo "$model fp32 build failed" | tee -a "$LOG"; status=1; continue; }
  for prec in int8-weight int4-weight int8 fp8; do
    calib=()
    case "$prec" in
      int8 | fp8) calib=(--calib "$DATA/calib.jsonl") ;;
    esac
    plan="/tmp/qa/$model-cuda-$prec.plan"
    "$KILN" build --model "$ROOT/models/$model" "${template[@]}" --device cuda --precision "$prec" \
      "${calib[@]}" -o "$plan" >>"$LOG" 2>&1 ||
      { echo "$model $prec build failed" | tee -a "$LOG"; status=1; continue; }
    "$KILN" eval --compare "/tmp/qa/$model-fp32.plan" "$plan" --dataset "$DATA/dev.jsonl" \
      --max-drop 0.02 --json 2>>"$LOG" | sed "s/^{/{\"model\": \"$model\", \"precision\": \"$prec\", /" |
      tee -a "$JSON" | tee -a "$LOG"
    rc=${PIPESTATUS[0]}
    echo "$model cuda $prec: eval --compare exit $rc" | tee -a "$LOG"
    [ "$rc" = 0 ] || status=1
  done
done
exit $status
