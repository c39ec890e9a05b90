#!/bin/bash
# Peak memory of `kiln build --onnx` at size, on this machine: the fixture BLOOM export with its
# vocabulary scaled to V rows (onnx_scale_vocab.cc: embedding [V, 32] and lm_head [32, V] of
# random values; V = 4,000,000 makes two 512 MB tensors, a 1 GB file), built with the build
# folder's kiln. Usage: bench/build/onnx_memory.sh [BUILD_DIR] [V]
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build}
V=${2:-4000000}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
g++ -O2 -std=c++20 "$ROOT/bench/build/onnx_scale_vocab.cc" -I"$BUILD/generated/onnx_proto" \
  "$BUILD/libkiln_onnx_proto.a" -lprotobuf -o "$TMP/scale"
"$TMP/scale" "$ROOT/../shared/fixtures/onnx/bloom.onnx" "$V" "$TMP/bloom.onnx"
ls -l "$TMP/bloom.onnx" | awk '{printf "export: %.2f GiB\n", $5 / 2^30}'
/usr/bin/time -f "kiln build --onnx: peak %M KB, %e s" "$BUILD/kiln" build --onnx "$TMP/bloom.onnx" \
  --tokenizer "$ROOT/models/bloom-tiny/tokenizer.json" -o "$TMP/bloom.plan" 2>&1 |
  grep -E "build finished|peak"
