#!/usr/bin/env bash
# The server tests: builds plans of the fixture models into a Triton-layout repository, starts
# `kiln serve` on free ports (the server picks them: --*-port 0, printed at start), runs the
# suites against it with real clients (curl, and the @grpc/grpc-js and openai npm packages), and
# stops it with SIGTERM (which must drain and exit 0).
#   tests/server/run.sh KILN FIXTURES TMP [SUITE...]   suites: curl, openai (the openai npm
#   package), load (kiln perf under load, client disconnects, SIGTERM with requests in flight);
#   those three by default; grpc (the grpc-js suite runs in kiln_tests too:
#   GrpcFrontendTest.NodeClients)
set -uo pipefail
KILN=$(realpath "$1")
FIXTURES=$(realpath "$2")
TMP="$3/server"
shift 3
SUITES=("$@")
[ ${#SUITES[@]} -gt 0 ] || SUITES=(curl openai load)
HERE=$(cd "$(dirname "$0")" && pwd)
rm -rf "$TMP" && mkdir -p "$TMP"
export KILN FIXTURES TMP HERE

# --- the repository -------------------------------------------------------------------------
REPO="$TMP/repo"
mkdir -p "$REPO/bloom/1" "$REPO/t5/1" "$REPO/broken/1" "$REPO/tensorrt/1"
"$KILN" build -q --model "$FIXTURES/bloom-tiny" --prompt-template "{prompt} =" -o "$REPO/bloom/1/model.plan" || exit 1
"$KILN" build -q --model "$FIXTURES/t5-tiny" -o "$REPO/t5/1/model.plan" || exit 1
cat > "$REPO/bloom/config.pbtxt" <<'EOF'
name: "bloom"
platform: "kiln_plan"
max_batch_size: 16
input [ { name: "text_input" data_type: TYPE_STRING dims: [ 1 ] } ]
output [ { name: "text_output" data_type: TYPE_STRING dims: [ -1 ] } ]
instance_group [ { count: 1 kind: KIND_CPU } ]
dynamic_batching { max_queue_delay_microseconds: 1000 default_queue_policy { max_queue_size: 256 } }
parameters { key: "default_max_tokens" value { string_value: "16" } }
model_warmup [ { name: "w" batch_size: 1 } ]
EOF
# No config.pbtxt at all: the defaults (text_input -> text_output), two engines.
cat > "$REPO/t5/config.pbtxt" <<'EOF'
backend: "kiln"
instance_group [ { count: 2 } ]
EOF
# A model that cannot load (a plan that is not one) and one for another platform: both are
# reported in the index with the reason, and the others serve.
echo "not a plan" > "$REPO/broken/1/model.plan"
echo 'platform: "tensorrt_plan"' > "$REPO/tensorrt/config.pbtxt"
cp "$REPO/bloom/1/model.plan" "$REPO/tensorrt/1/model.plan"
export REPO

# --- start / stop -----------------------------------------------------------------------------
# start_server NAME ARGS...: runs kiln serve in the background, waits for its ports; sets
# <NAME>_PID, <NAME>_HTTP, <NAME>_GRPC, <NAME>_METRICS.
start_server() {
  local name=$1
  shift
  "$KILN" serve --http-port 0 --grpc-port 0 --metrics-port 0 "$@" > "$TMP/$name.out" 2> "$TMP/$name.err" &
  local pid=$!
  for _ in $(seq 1 300); do
    grep -q "model version(s) ready" "$TMP/$name.out" 2>/dev/null && break
    kill -0 "$pid" 2>/dev/null || { echo "FAIL: kiln serve ($name) exited at start:"; cat "$TMP/$name.err"; return 1; }
    sleep 0.1
  done
  grep -q "model version(s) ready" "$TMP/$name.out" || { echo "FAIL: kiln serve ($name) not ready in 30 s"; cat "$TMP/$name.err"; return 1; }
  local http grpc metrics
  http=$(sed -n 's|^kiln serve: HTTP on \(http://[^ ]*\).*|\1|p' "$TMP/$name.out")
  grpc=$(sed -n 's|^kiln serve: gRPC on \([^ ]*\).*|\1|p' "$TMP/$name.out")
  metrics=$(sed -n 's|^kiln serve: metrics on \(http://[^ ]*\).*|\1|p' "$TMP/$name.out")
  printf -v "${name}_PID" '%s' "$pid"
  printf -v "${name}_HTTP" '%s' "$http"
  printf -v "${name}_GRPC" '%s' "$grpc"
  printf -v "${name}_METRICS" '%s' "$metrics"
}
export -f start_server  # load.sh starts a server of its own

status=0
start_server main --model-repository "$REPO" --request-log "$TMP/requests.jsonl" || exit 1
export HTTP_URL=$main_HTTP GRPC_ADDR=$main_GRPC METRICS_URL=$main_METRICS SERVER_PID=$main_PID
echo "kiln serve: $HTTP_URL (gRPC ${GRPC_ADDR:-off}, metrics ${METRICS_URL:-off})"

# npm clients, installed from the lock file once (the only network the tests use).
need_npm() {
  [ -d "$HERE/node_modules/openai" ] && [ -d "$HERE/node_modules/@grpc/grpc-js" ] && return 0
  (cd "$HERE" && npm ci --no-audit --no-fund --loglevel=error) || { echo "FAIL: npm ci in tests/server"; return 1; }
}

for suite in "${SUITES[@]}"; do
  echo "=== $suite"
  SECONDS=0
  case $suite in
    curl) bash "$HERE/curl.sh" || status=1 ;;
    grpc)
      if [ -z "$GRPC_ADDR" ]; then echo "SKIP: gRPC off"; elif [ -f "$HERE/grpc.test.mjs" ]; then
        need_npm && KILN_GRPC_ADDR=$GRPC_ADDR KILN_HTTP_URL=$HTTP_URL node --test "$HERE/grpc.test.mjs" || status=1
      fi ;;
    openai)
      need_npm && KILN_HTTP_URL=$HTTP_URL KILN_BIN=$KILN KILN_REPO=$REPO node --test "$HERE/openai.test.mjs" || status=1 ;;
    load) bash "$HERE/load.sh" || status=1 ;;
    *) echo "unknown suite $suite"; status=1 ;;
  esac
  echo "=== $suite: ${SECONDS} s"
done

# A second server in explicit control mode: the repository API loads and unloads.
if [[ " ${SUITES[*]} " == *" curl "* ]]; then
  echo "=== explicit"
  start_server explicit --model-repository "$REPO" --model-control-mode explicit --load-model t5 || exit 1
  HTTP_URL=$explicit_HTTP bash "$HERE/explicit.sh" || status=1
  kill -TERM "$explicit_PID"; wait "$explicit_PID" || { echo "FAIL: explicit server exit $?"; status=1; }
fi

kill -0 "$SERVER_PID" 2>/dev/null || { echo "FAIL: the server died during the tests"; cat "$TMP/main.err" | tail -20; exit 1; }
kill -TERM "$SERVER_PID"
wait "$SERVER_PID"
code=$?
[ "$code" -eq 0 ] || { echo "FAIL: kiln serve exited $code after SIGTERM"; status=1; }
if [ $status -ne 0 ]; then echo "--- server log (last 30 lines)"; tail -30 "$TMP/main.err"; fi
[ $status -eq 0 ] && echo "server tests: all passed"
exit $status
