#!/bin/bash
# On the GPU machine: CUDA parity of plans lifted from ONNX exports. Each export, given as
# DIR:bloom:NAME (DIR/NAME.onnx) or DIR:t5:ENCODER:DECODER (DIR/ENCODER.onnx + DIR/DECODER.onnx),
# is built with `kiln build --onnx --device cuda` at fp32 and fp16 and run by `kiln exec --plan`
# on its inputs in DIR/reference.safetensors (BLOOM: logits; T5: the encoder's states, and the
# decoder's logits on the export's own inputs, onnxruntime's encoder states), compared with
# onnxruntime's outputs there. Run from the folder scripts/device/pack.sh filled.
# Log: $OUT/onnx_cuda.log. Usage: onnx_cuda.sh BLOOM_TOKENIZER T5_TOKENIZER SPEC ...
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}
source "$HERE/bundle_env.sh"
LOG="$OUT/onnx_cuda.log"
bloom_tok=$1 t5_tok=$2
shift 2
for spec in "$@"; do
  IFS=: read -r dir family name dec <<<"$spec"
  ref="$dir/reference.safetensors"
  for prec in fp32 fp16; do
    plan=/tmp/onnx-$name-$prec.plan
    if [ "$family" = bloom ]; then
      "$KILN" build --onnx "$dir/$name.onnx" --tokenizer "$bloom_tok" --device cuda \
        --precision "$prec" -o "$plan" -q >>"$LOG" 2>&1 || { echo "$name $prec: build failed" | tee -a "$LOG"; continue; }
      runs=("decoder:$name.in.:$name.out.:attention_mask")
    else
      "$KILN" build --onnx "$dir/$name.onnx" --onnx "$dir/$dec.onnx" \
        --tokenizer "$t5_tok" --device cuda --precision "$prec" -o "$plan" -q >>"$LOG" 2>&1 ||
        { echo "$name $prec: build failed" | tee -a "$LOG"; continue; }
      runs=("encoder:$name.in.:$name.out.:attention_mask" "decoder:$dec.in.:$dec.out.:")
    fi
    # fp32 plans of fp32 exports: 1e-4 / 1e-3. fp16 plans, or exports computed in fp16 by
    # onnxruntime: within 2 % of the largest value.
    tol=(--atol 1e-4 --rtol 1e-3)
    [ "$prec" = fp16 ] || [[ "$name" == *fp16* ]] && tol=(--atol 2e-2 --rtol 2e-2)
    for r in "${runs[@]}"; do
      IFS=: read -r graph in_prefix out_prefix mask <<<"$r"
      masking=()
      [ -n "$mask" ] && masking=(--compare-mask "$mask")
      echo "== $name $prec $graph" | tee -a "$LOG"
      "$KILN" exec --plan "$plan" --graph "$graph" --inputs "$ref" --input-prefix "$in_prefix" \
        -o "/tmp/onnx-$name-$prec-$graph.safetensors" --compare "$ref" \
        --compare-prefix "$out_prefix" "${tol[@]}" "${masking[@]}" 2>&1 |
        grep -E "max abs|PASS|FAIL|error" | tee -a "$LOG"
    done
  done
done
