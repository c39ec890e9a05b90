#!/bin/bash
# On the GPU machine: unpacks the bundle made by pack.sh and runs the CUDA-relevant tests (the
# op harness against the reference backend, HF parity of the fixture models on CUDA, plans),
# with logs in $OUT. The test binary has this build's fixture and tmp paths compiled in, so they
# are recreated here. Usage: cuda_tests.sh [GTEST_FILTER] (log: $OUT/${TESTLOG:-cuda_tests.log})
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}
source "$HERE/bundle_env.sh"
# The test binary's compiled-in scratch folder (the build folder it was made in, on this machine).
TEST_TMP=$(strings "$HERE/x/bin/kiln_tests" | grep -m1 -E '^/[^ ]*/test_tmp$' || echo /tmp/test_tmp)
mkdir -p /work/shared "$TEST_TMP"
ln -sfn "$HERE/x/fixtures" /work/shared/fixtures
ROOT=$(cd "$HERE/../.." && pwd)  # the working tree's copy of the fixture models (models/)
for model in t5-tiny bloom-tiny; do
  for f in "$ROOT/models/$model"/*; do
    [ -e "$HERE/x/fixtures/$model/$(basename "$f")" ] || ln -s "$f" "$HERE/x/fixtures/$model/"
  done
done
nvidia-smi -L
"$KILN" --version
FILTER=${1:-'BackendOps*:*Parity*:*Cuda*:PlanTest*:*RunAhead*'}
"$HERE/x/bin/kiln_tests" --gtest_filter="$FILTER" 2>&1 | tee "$OUT/${TESTLOG:-cuda_tests.log}" |
  grep -E '^\[  FAILED|^\[  PASSED|^\[  SKIPPED|parity\]|Failure|error|expected|differ'
echo "tests exit: ${PIPESTATUS[0]}"
