# Sourced by the GPU machine's scripts (run.sh, decode_ab.sh, cuda_tests.sh) from the folder
# pack.sh filled: unpacks the bundle once into x/, puts its libraries, CUDA's and cuBLASLt's on
# LD_LIBRARY_PATH, and sets KILN to the kiln binary. Expects HERE (that folder) and OUT.
mkdir -p "$OUT" "$HERE/x"
[ -x "$HERE/x/bin/kiln" ] && [ -x "$HERE/x/bin/kiln_tests" ] ||
  tar -C "$HERE/x" -xJf "$HERE/bundle.tar.xz"
CUBLAS_DIR=$(dirname "$(find / -name 'libcublasLt.so.13*' -not -path '/proc/*' 2>/dev/null | head -1)")
export LD_LIBRARY_PATH="$HERE/x/lib:/usr/local/cuda/lib64:$CUBLAS_DIR:${LD_LIBRARY_PATH:-}"
KILN="$HERE/x/bin/kiln"

# start_server LABEL PLAN [NAME=VALUE ...]: starts `kiln serve --plan PLAN` as model "m" on free
# ports (the environment assignments apply to the server only; BIN=PATH serves with another
# kiln binary), output in $OUT/serve-LABEL.out and .err, and waits for /v2/health/ready. Sets
# SERVER_PID, SERVER_URL, METRICS_URL and SERVER_READY_MS (exec to the first 200). stop_server
# sends SIGTERM and waits (the server drains and exits 0).
start_server() {
  local label=$1 plan=$2 bin=$KILN t0 t1
  shift 2
  local env_args=()
  for a in "$@"; do
    case $a in BIN=*) bin=${a#BIN=} ;; *) env_args+=("$a") ;; esac
  done
  SERVER_URL="" METRICS_URL=""
  t0=$(date +%s%N)
  env "${env_args[@]}" "$bin" serve --plan "$plan" --name m --http-port 0 --grpc-port -1 \
    --metrics-port 0 --max-batch 64 --http-threads 256 >"$OUT/serve-$label.out" \
    2>"$OUT/serve-$label.err" &
  SERVER_PID=$!
  for _ in $(seq 1 4000); do
    [ -z "$SERVER_URL" ] &&
      SERVER_URL=$(sed -n 's|^kiln serve: HTTP on \(http://[^ ]*\).*|\1|p' "$OUT/serve-$label.out")
    [ -n "$SERVER_URL" ] &&
      [ "$(curl -s -o /dev/null -w '%{http_code}' "$SERVER_URL/v2/health/ready")" = 200 ] && break
    kill -0 "$SERVER_PID" 2>/dev/null || { echo "kiln serve $label exited early" >&2; return 1; }
    sleep 0.005
  done
  t1=$(date +%s%N)
  SERVER_READY_MS=$(((t1 - t0) / 1000000))
  METRICS_URL=$(sed -n 's|^kiln serve: metrics on \(http://[^ ]*\).*|\1|p' "$OUT/serve-$label.out")
}
stop_server() {
  kill -TERM "$SERVER_PID"
  wait "$SERVER_PID"
}
