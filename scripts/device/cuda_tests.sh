#!/bin/bash
# On the GPU machine: unpacks the bundle made by pack.sh and runs the CUDA-relevant tests (the
# op harness against the reference backend, HF parity of the fixture models on CUDA, plans),
# with logs in $OUT. The test binary has this build's fixture and tmp paths compiled in, so they
# are recreated here. Usage: cuda_tests.sh [GTEST_FILTER]
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT" "$HERE/x"
tar -C "$HERE/x" -xJf "$HERE/bundle.tar.xz"
mkdir -p /work/shared /work/wt-cuda/build-cuda/test_tmp
ln -sfn "$HERE/x/fixtures" /work/shared/fixtures
CUBLAS_DIR=$(dirname "$(find / -name 'libcublasLt.so.13*' -not -path '*/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="$HERE/x/lib:/usr/local/cuda/lib64:$CUBLAS_DIR:${LD_LIBRARY_PATH:-}"
nvidia-smi -L
"$HERE/x/bin/kiln" --version
FILTER=${1:-'BackendOps*:*Parity*:*Cuda*:PlanTest*'}
"$HERE/x/bin/kiln_tests" --gtest_filter="$FILTER" 2>&1 | tee "$OUT/cuda_tests.log" |
  grep -E '^\[  FAILED|^\[  PASSED|^\[  SKIPPED|parity\]|Failure|error|expected|differ'
echo "tests exit: ${PIPESTATUS[0]}"
