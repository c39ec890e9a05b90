#!/bin/bash
# On the GPU machine: CUDA parity of plans lifted from ONNX exports. Each export given as
# DIR/NAME.onnx (BLOOM) or DIR/NAME_encoder.onnx + DIR/NAME_decoder.onnx (T5) is built with
# `kiln build --onnx --device cuda` at fp32 and fp16, run by `kiln exec --plan` on its inputs
# in DIR/reference.safetensors, and compared with onnxruntime's outputs there. Run from the
# folder scripts/device/pack.sh filled. Log: $OUT/onnx_cuda.log.
# Usage: onnx_cuda.sh BLOOM_TOKENIZER T5_TOKENIZER DIR:bloom:NAME|DIR:t5:NAME ...
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}
source "$HERE/bundle_env.sh"
LOG="$OUT/onnx_cuda.log"
bloom_tok=$1 t5_tok=$2
shift 2
for spec in "$@"; do
  IFS=: read -r dir family name <<<"$spec"
  ref="$dir/reference.safetensors"
  for prec in fp32 fp16; do
    plan=/tmp/onnx-$name-$prec.plan
    if [ "$family" = bloom ]; then
      "$KILN" build --onnx "$dir/$name.onnx" --tokenizer "$bloom_tok" --device cuda \
        --precision "$prec" -o "$plan" -q >>"$LOG" 2>&1 || { echo "$name $prec: build failed" | tee -a "$LOG"; continue; }
      runs=("decoder:$name.in.:$name.out.:attention_mask")
    else
      "$KILN" build --onnx "$dir/${name}_encoder.onnx" --onnx "$dir/${name}_decoder.onnx" \
        --tokenizer "$t5_tok" --device cuda --precision "$prec" -o "$plan" -q >>"$LOG" 2>&1 ||
        { echo "$name $prec: build failed" | tee -a "$LOG"; continue; }
      runs=("encoder:${name}_encoder.in.:${name}_encoder.out.:attention_mask")
    fi
    # fp16 plans compute in fp16: onnxruntime's fp32 outputs within 2 % of their largest value.
    tol=(--atol 1e-4 --rtol 1e-3)
    [ "$prec" = fp16 ] && tol=(--atol 2e-2 --rtol 2e-2)
    for r in "${runs[@]}"; do
      IFS=: read -r graph in_prefix out_prefix mask <<<"$r"
      echo "== $name $prec $graph" | tee -a "$LOG"
      "$KILN" exec --plan "$plan" --graph "$graph" --inputs "$ref" --input-prefix "$in_prefix" \
        -o "/tmp/onnx-$name-$prec-$graph.safetensors" --compare "$ref" \
        --compare-prefix "$out_prefix" "${tol[@]}" --compare-mask "$mask" 2>&1 |
        grep -E "max abs|PASS|FAIL|error" | tee -a "$LOG"
    done
  done
done
