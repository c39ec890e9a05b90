#!/usr/bin/env bash
# kiln perf: bad flags are usage errors (exit 2) before anything is sent, an unreachable server
# is exit 1 at once, and against a stand-in server (perf_fake_server.py: known TTFT and token
# gaps) every protocol and mode reports what the server did. Timings are only checked against
# the server's own sleeps (lower bounds), never for speed.
source "$(dirname "$0")/lib.bash"
HERE="$(dirname "$0")"

# A port nothing listens on: bound by Python, then closed.
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
DEAD="http://127.0.0.1:$(free_port)"
perf=("$KILN" perf --url "$DEAD" --model m)

# --- usage errors: exit 2, naming the flag ---
expect_exit 2 "no prompts" -- "${perf[@]}"
expect_in "$TMP/err" "give --prompt-len N (synthetic prompts) or --prompts FILE.jsonl" "says what to give"
echo '"a"' > "$TMP/p.jsonl"
expect_exit 2 "both prompt kinds" -- "${perf[@]}" --prompt-len 8 --prompts "$TMP/p.jsonl"
expect_in "$TMP/err" "excludes" "names the conflict"
for c in 0 1025 "1,,8" "1,x" "8," -3; do
  expect_exit 2 "--concurrency '$c'" -- "${perf[@]}" --prompt-len 8 --concurrency "$c"
  expect_in "$TMP/err" "is not an integer in 1..1024" "--concurrency '$c' names the rule"
done
expect_exit 2 "--duration 0" -- "${perf[@]}" --prompt-len 8 --duration 0
expect_in "$TMP/err" "--duration" "names --duration"
expect_exit 2 "--warmup -1" -- "${perf[@]}" --prompt-len 8 --warmup -1
expect_exit 2 "--output-len 0" -- "${perf[@]}" --prompt-len 8 --output-len 0
expect_in "$TMP/err" "--output-len" "names --output-len"
expect_exit 2 "--prompt-len 0" -- "${perf[@]}" --prompt-len 0
expect_exit 2 "--protocol http" -- "${perf[@]}" --prompt-len 8 --protocol http
expect_in "$TMP/err" "--protocol" "names --protocol"
expect_exit 2 "--protocol grpc with a path" -- "$KILN" perf --url "$DEAD/x" --model m --prompt-len 8 --protocol grpc
expect_in "$TMP/err" "gRPC takes HOST:PORT" "says what gRPC takes"
expect_exit 2 "--url ftp://" -- "$KILN" perf --url ftp://x:1 --model m --prompt-len 8
expect_in "$TMP/err" "http:// or https://" "says which schemes"
expect_exit 2 "--url with a bad port" -- "$KILN" perf --url http://localhost:http --model m --prompt-len 8
expect_exit 2 "--temperature -1" -- "${perf[@]}" --prompt-len 8 --temperature -1
expect_exit 2 "no --url" -- "$KILN" perf --model m --prompt-len 8
expect_exit 2 "unknown flag" -- "${perf[@]}" --prompt-len 8 --concurency 4
expect_in "$TMP/err" "did you mean --concurrency?" "suggests the flag"
echo '{"x": 1}' > "$TMP/bad.jsonl"
expect_exit 2 "a bad --prompts row" -- "${perf[@]}" --prompts "$TMP/bad.jsonl"
expect_in "$TMP/err" "bad.jsonl:1" "names file:line"
: > "$TMP/empty_key"
expect_exit 2 "an empty --api-key-file" -- "${perf[@]}" --prompt-len 8 --api-key-file "$TMP/empty_key"
# --- missing files: exit 1 ---
expect_exit 1 "a missing --prompts" -- "${perf[@]}" --prompts "$TMP/none.jsonl"
expect_in "$TMP/err" "no such file" "says so"
expect_exit 1 "a missing --api-key-file" -- "${perf[@]}" --prompt-len 8 --api-key-file "$TMP/none"

# --- unreachable: exit 1 at the first request, not after --duration of errors ---
start=$(date +%s)
expect_exit 1 "unreachable server" -- "${perf[@]}" --prompt-len 8 --duration 60 --concurrency 1,8
expect_in "$TMP/err" "cannot reach $DEAD" "names the URL"
[ $(( $(date +%s) - start )) -lt 10 ] || fail "unreachable server took $(( $(date +%s) - start )) s"
[ ! -s "$TMP/out" ] || fail "printed results for an unreachable server: $(cat "$TMP/out")"
expect_exit 1 "unreachable gRPC server" -- "$KILN" perf --url "${DEAD#http://}" --model m --prompt-len 8 --protocol grpc --stream
expect_in "$TMP/err" "cannot reach" "gRPC: says so"
expect_in "$TMP/err" "UNAVAILABLE" "gRPC: with gRPC's status"

# --- against the stand-in server: 20 ms to the first token, then 5 ms a token ---
# The port file of an earlier run goes first: the loop below could see it before the background
# shell truncates it.
rm -f "$TMP/port"
python3 "$HERE/perf_fake_server.py" bloom --api-key sekrit > "$TMP/port" 2> "$TMP/server_err" &
server_pid=$!
trap 'kill $server_pid 2>/dev/null' EXIT
for _ in $(seq 50); do [ -s "$TMP/port" ] && break; sleep 0.1; done
URL="http://127.0.0.1:$(head -1 "$TMP/port")"
echo sekrit > "$TMP/key"
common=("$KILN" perf --url "$URL" --model bloom --api-key-file "$TMP/key" --output-len 6
        --duration 1 --warmup 0.2)
run=("${common[@]}" --prompt-len 16)

# check_json FILE PROTOCOL STREAM LEVELS: every field, and timings no faster than the server's.
check_json() {
  python3 - "$@" <<'PY'
import json, sys
path, protocol, stream, levels = sys.argv[1], sys.argv[2], sys.argv[3] == "1", sys.argv[4]
j = json.load(open(path))
assert j["protocol"] == protocol and j["stream"] == stream and j["output_len"] == 6, j
assert j["percentiles"] == "nearest-rank"
assert [r["concurrency"] for r in j["results"]] == [int(c) for c in levels.split(",")], j
for r in j["results"]:
    assert r["errors"] == 0 and r["first_error"] is None, r
    assert r["completed"] > 0 and r["output_tokens"] == 6 * r["completed"], r
    assert r["output_tokens_counted_by_server"], r
    assert abs(r["requests_per_s"] - r["completed"] / r["window_s"]) < 1e-9, r
    assert abs(r["output_tokens_per_s"] - r["output_tokens"] / r["window_s"]) < 1e-9, r
    for k in ("p50", "p90", "p99", "mean"):
        assert r["output_tokens_per_request_" + k] == 6, r
        assert r["e2e_latency_ms_" + k] >= 20 + 5 * 5, r  # the server's sleeps
        if stream:
            assert r["ttft_ms_" + k] >= 20 and r["itl_ms_" + k] >= 5, r
            assert r["ttft_ms_" + k] <= r["e2e_latency_ms_" + k], r
        else:
            assert r["ttft_ms_" + k] is None and r["itl_ms_" + k] is None, r
    assert r["ttft_ms_p50"] is None or r["ttft_ms_p50"] <= r["ttft_ms_p90"] <= r["ttft_ms_p99"], r
PY
}
expect_exit 0 "openai streamed --json" -- "${run[@]}" --stream --concurrency 1,3 --json
check_json "$TMP/out" openai 1 1,3 || fail "openai streamed --json"
[ "$(wc -l < "$TMP/out")" -eq 1 ] || fail "--json printed $(wc -l < "$TMP/out") lines, expected one object"
expect_exit 0 "openai whole --json" -- "${run[@]}" --concurrency 2 --json
check_json "$TMP/out" openai 0 2 || fail "openai whole --json"
expect_exit 0 "kserve streamed --json" -- "${run[@]}" --protocol kserve --stream --concurrency 2 --json
check_json "$TMP/out" kserve 1 2 || fail "kserve streamed --json"
expect_exit 0 "kserve whole --json" -- "${run[@]}" --protocol kserve --concurrency 1 --json
check_json "$TMP/out" kserve 0 1 || fail "kserve whole --json"

expect_exit 0 "table" -- "${common[@]}" --stream --concurrency 1,2 --prompts "$TMP/p.jsonl"
for text in "concurrency 1:" "concurrency 2:" "requests/s" "output tokens/s" "time to first token ms" \
    "inter-token latency ms" "end-to-end latency ms" "p99" "0 errors" "p.jsonl (1 prompt)"; do
  expect_in "$TMP/out" "$text" "the table"
done

# The first request fails: exit 1 with the server's message, nothing measured.
expect_exit 1 "unknown model" -- "$KILN" perf --url "$URL" --model nope --api-key-file "$TMP/key" --prompt-len 4
expect_in "$TMP/err" "HTTP 404: no model named nope" "the server's message"
expect_exit 1 "no API key" -- "$KILN" perf --url "$URL" --model bloom --prompt-len 4
expect_in "$TMP/err" "HTTP 401: bad API key" "the server's message"

finish
