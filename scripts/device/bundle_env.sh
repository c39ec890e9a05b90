# Sourced by the GPU machine's scripts (run.sh, decode_ab.sh, cuda_tests.sh) from the folder
# pack.sh filled: unpacks the bundle once into x/, puts its libraries, CUDA's and cuBLASLt's on
# LD_LIBRARY_PATH, and sets KILN to the kiln binary. Expects HERE (that folder) and OUT.
mkdir -p "$OUT" "$HERE/x"
[ -x "$HERE/x/bin/kiln" ] && [ -x "$HERE/x/bin/kiln_tests" ] ||
  tar -C "$HERE/x" -xJf "$HERE/bundle.tar.xz"
CUBLAS_DIR=$(dirname "$(find / -name 'libcublasLt.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="$HERE/x/lib:/usr/local/cuda/lib64:$CUBLAS_DIR:${LD_LIBRARY_PATH:-}"
KILN="$HERE/x/bin/kiln"
