#!/usr/bin/env bash
# curl against every KServe v2 HTTP endpoint (the binary tensor extension included), Triton's
# generate extension with SSE, and malformed requests of every kind. Expected texts come from
# `kiln run` on the same plan, never from this server.
# Env (run.sh): KILN, REPO, TMP, HTTP_URL.
set -uo pipefail
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
T="$TMP/curl"
mkdir -p "$T"
BLOOM="$REPO/bloom/1/model.plan"
T5="$REPO/t5/1/model.plan"

# code METHOD PATH [curl args...]: prints the HTTP status; the body is in $T/body.
code() {
  local method=$1 path=$2
  shift 2
  curl -s -o "$T/body" -w '%{http_code}' -X "$method" "$HTTP_URL$path" "$@"
}
expect() {  # expect STATUS DESCRIPTION METHOD PATH [curl args]
  local want=$1 what=$2
  shift 2
  local got
  got=$(code "$@")
  [ "$got" = "$want" ] || fail "$what: HTTP $got, expected $want: $(head -c 300 "$T/body")"
}
body_has() { grep -q -- "$1" "$T/body" || fail "$2: body lacks '$1': $(head -c 300 "$T/body")"; }
json() { python3 -c "import json,sys; d=json.load(open('$T/body')); print($1)"; }
# The text `kiln run` generates: run_text PLAN PROMPT [flags]
run_text() {
  local plan=$1 prompt=$2
  shift 2
  "$KILN" run -q --plan "$plan" --prompt "$prompt" --json "$@" |
    python3 -c "import json,sys; print(json.loads(sys.stdin.readline())['text'], end='')"
}

# --- health, metadata, config, stats ---
expect 200 "live" GET /v2/health/live
# Server readiness is false: a model of the repository failed to load (Triton's rule).
expect 400 "ready with a failed model" GET /v2/health/ready
expect 200 "server metadata" GET /v2
body_has '"name":"kiln"' "server metadata"
body_has '"binary_tensor_data"' "extensions"
expect 200 "model metadata" GET /v2/models/bloom
body_has '"platform":"kiln_plan"' "model metadata"
body_has '"text_input"' "model metadata inputs"
expect 200 "version metadata" GET /v2/models/bloom/versions/1
expect 200 "model ready" GET /v2/models/bloom/ready
expect 200 "version ready" GET /v2/models/t5/versions/1/ready
expect 400 "broken model not ready" GET /v2/models/broken/ready
expect 400 "unknown version not ready" GET /v2/models/bloom/versions/7/ready
expect 200 "config" GET /v2/models/bloom/config
[ "$(json "d['max_batch_size']")" = "16" ] || fail "config max_batch_size"
[ "$(json "d['dynamic_batching']['default_queue_policy']['max_queue_size']")" = "256" ] || fail "config queue size"
expect 200 "t5 config (defaults filled)" GET /v2/models/t5/config
[ "$(json "d['input'][0]['name']")" = "text_input" ] || fail "default input name"
[ "$(json "d['instance_group'][0]['count']")" = "2" ] || fail "instance count"
expect 200 "stats" GET /v2/models/bloom/stats
body_has '"inference_stats"' "stats"
expect 200 "all stats" GET /v2/models/stats
expect 200 "repository index" POST /v2/repository/index -d '{}'
python3 - "$T/body" <<'EOF' || fail "repository index"
import json, sys
idx = {(e["name"]): e for e in json.load(open(sys.argv[1]))}
assert idx["bloom"]["state"] == "READY", idx
assert idx["t5"]["state"] == "READY", idx
assert idx["broken"]["state"] == "UNAVAILABLE" and "plan" in idx["broken"]["reason"], idx["broken"]
assert idx["tensorrt"]["state"] == "UNAVAILABLE" and "kiln_plan" in idx["tensorrt"]["reason"], idx["tensorrt"]
EOF
expect 200 "ready-only index" POST /v2/repository/index -d '{"ready": true}'
python3 -c "import json; assert {e['name'] for e in json.load(open('$T/body'))} == {'bloom', 't5'}" || fail "ready index lists only ready models"
expect 400 "load in mode none" POST /v2/repository/models/bloom/load -d '{}'
body_has "explicit" "load in mode none explains"
grep -q "model_warmup" "$TMP/main.err" || fail "unknown config field model_warmup not warned about"

# --- infer: JSON tensors, a batch, parameters as tensors and as parameters ---
want1=$(run_text "$BLOOM" "add: 456 + 95" --max-new-tokens 8)
want2=$(run_text "$BLOOM" "add: 12 + 30" --max-new-tokens 8)
expect 200 "infer JSON" POST /v2/models/bloom/infer -d '{"id": "r1", "parameters": {"max_tokens": 8},
  "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [2, 1], "data": [["add: 456 + 95"], ["add: 12 + 30"]]}]}'
[ "$(json "d['outputs'][0]['data'][0]")" = "$want1" ] || fail "infer text 1: $(cat "$T/body") vs '$want1'"
[ "$(json "d['outputs'][0]['data'][1]")" = "$want2" ] || fail "infer text 2 (batch)"
[ "$(json "d['outputs'][0]['shape']")" = "[2, 1]" ] || fail "infer output shape follows the input"
[ "$(json "d['id']")" = "r1" ] || fail "infer id echoed"
expect 200 "infer with parameter tensors" POST /v2/models/bloom/infer -d '{"inputs": [
  {"name": "text_input", "datatype": "BYTES", "shape": [1], "data": ["add: 456 + 95"]},
  {"name": "max_tokens", "datatype": "INT32", "shape": [1], "data": [8]}],
  "outputs": [{"name": "text_output"}, {"name": "token_ids"}]}'
[ "$(json "d['outputs'][0]['data'][0]")" = "$want1" ] || fail "infer with max_tokens tensor"
[ "$(json "d['outputs'][1]['name']")" = "token_ids" ] || fail "token_ids output"

# --- infer: the binary tensor data extension (request and response) ---
python3 - "$T/bin_req" <<'EOF'
import json, struct, sys
prompt = b"add: 456 + 95"
raw = struct.pack("<I", len(prompt)) + prompt
head = json.dumps({"parameters": {"max_tokens": 8, "binary_data_output": True},
                   "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1],
                               "parameters": {"binary_data_size": len(raw)}}]}).encode()
open(sys.argv[1], "wb").write(head + raw)
open(sys.argv[1] + ".len", "w").write(str(len(head)))
EOF
curl -s -D "$T/headers" -o "$T/bin_resp" -X POST "$HTTP_URL/v2/models/bloom/infer" \
  -H "Inference-Header-Content-Length: $(cat "$T/bin_req.len")" \
  -H "Content-Type: application/octet-stream" --data-binary "@$T/bin_req"
python3 - "$T/bin_resp" "$T/headers" "$want1" <<'EOF' || fail "binary infer"
import json, struct, sys
body = open(sys.argv[1], "rb").read()
headers = {l.split(":", 1)[0].lower(): l.split(":", 1)[1].strip() for l in open(sys.argv[2]) if ":" in l}
n = int(headers["inference-header-content-length"])
head = json.loads(body[:n])
out = head["outputs"][0]
size = out["parameters"]["binary_data_size"]
raw = body[n:n + size]
(length,) = struct.unpack("<I", raw[:4])
text = raw[4:4 + length].decode()
assert text == sys.argv[3], (text, sys.argv[3])
EOF

# --- generate and generate_stream (SSE) ---
expect 200 "generate" POST /v2/models/bloom/generate -d '{"text_input": "add: 456 + 95", "parameters": {"max_tokens": 8}}'
[ "$(json "d['text_output']")" = "$want1" ] || fail "generate text: $(cat "$T/body") vs '$want1'"
expect 200 "generate (top-level fields, as Triton's clients send)" POST /v2/models/bloom/versions/1/generate \
  -d '{"text_input": "add: 456 + 95", "max_tokens": 8, "temperature": 0}'
[ "$(json "d['text_output']")" = "$want1" ] || fail "generate with top-level fields"
beam=$(run_text "$T5" "reverse: suvogi" --beams 4 --max-new-tokens 12)
expect 200 "generate beam" POST /v2/models/t5/generate -d '{"text_input": "reverse: suvogi", "parameters": {"beam_width": 4, "max_tokens": 12}}'
[ "$(json "d['text_output']")" = "$beam" ] || fail "beam text: $(cat "$T/body") vs '$beam'"
curl -sN -o "$T/sse" -X POST "$HTTP_URL/v2/models/t5/generate_stream" \
  -d '{"text_input": "reverse: suvogi", "parameters": {"max_tokens": 12, "return_token_ids": true}}'
want_t5=$(run_text "$T5" "reverse: suvogi" --max-new-tokens 12)
python3 - "$T/sse" "$want_t5" <<'EOF' || fail "generate_stream"
import json, sys
events = [json.loads(l[6:]) for l in open(sys.argv[1]) if l.startswith("data: ")]
assert len(events) >= 2, events
text = "".join(e["text_output"] for e in events)
assert text == sys.argv[2], (text, sys.argv[2])
assert events[-1]["finish_reason"] in ("stop", "length"), events[-1]
assert all("token_ids" in e for e in events)
EOF
# Stop strings: the text ends before the first one.
full=$(run_text "$T5" "reverse: suvogi" --max-new-tokens 12)
stop=${full:2:2}
if [ -n "$stop" ]; then
  expect 200 "generate with stop" POST /v2/models/t5/generate -d "{\"text_input\": \"reverse: suvogi\", \"parameters\": {\"max_tokens\": 12, \"stop\": [\"$stop\"]}}"
  want_stop=${full%%"$stop"*}
  [ "$(json "d['text_output']")" = "$want_stop" ] || fail "stop '$stop': $(cat "$T/body") vs '$want_stop'"
  [ "$(json "d['finish_reason']")" = "stop" ] || fail "stop finish reason"
fi

# --- concurrency: outputs under load equal kiln run's (batch invariance) ---
python3 - "$FIXTURES/data/dev.jsonl" "$T/prompts" <<'EOF'
import json, sys
out = open(sys.argv[2], "w")
for i, line in enumerate(open(sys.argv[1])):
    if i >= 12: break
    d = json.loads(line)
    out.write(json.dumps(d.get("prompt") or d.get("text") or d.get("input")) + "\n")
EOF
"$KILN" run -q --plan "$T5" --input "$T/prompts" --max-new-tokens 16 --json > "$T/run_all.jsonl"
i=0
while read -r p; do
  curl -s -o "$T/conc_$i" -X POST "$HTTP_URL/v2/models/t5/generate" -d "{\"text_input\": $p, \"max_tokens\": 16}" &
  i=$((i + 1))
done < "$T/prompts"
wait
python3 - "$T" "$i" <<'EOF' || fail "concurrent outputs differ from kiln run"
import json, sys
t, n = sys.argv[1], int(sys.argv[2])
want = [json.loads(l)["text"] for l in open(f"{t}/run_all.jsonl")]
for i in range(n):
    got = json.load(open(f"{t}/conc_{i}"))["text_output"]
    assert got == want[i], (i, got, want[i])
EOF

# --- malformed requests: 4xx with a message, and the server stays healthy ---
expect 200 "stats before the malformed requests" GET /v2/models/bloom/stats
fail_before=$(json "d['model_stats'][0]['inference_stats']['fail']['count']")
expect 400 "truncated JSON" POST /v2/models/bloom/generate -d '{"text_input": "add'
body_has "not valid JSON" "truncated JSON"
expect 400 "wrong type" POST /v2/models/bloom/generate -d '{"text_input": 5}'
body_has "text_input" "wrong type names the field"
expect 400 "wrong parameter type" POST /v2/models/bloom/generate -d '{"text_input": "a", "parameters": {"max_tokens": "8"}}'
body_has "max_tokens" "names max_tokens"
expect 400 "huge max_tokens" POST /v2/models/bloom/generate -d '{"text_input": "a", "max_tokens": 100000000}'
body_has "max_tokens" "huge max_tokens named"
expect 400 "negative top_p" POST /v2/models/bloom/generate -d '{"text_input": "a", "top_p": -1}'
expect 400 "unknown field" POST /v2/models/bloom/generate -d '{"text_input": "a", "max_tokns": 3}'
body_has "max_tokns" "unknown field named"
expect 400 "missing prompt" POST /v2/models/bloom/generate -d '{"max_tokens": 3}'
expect 400 "empty prompt" POST /v2/models/bloom/generate -d '{"text_input": ""}'
printf '{"text_input": "\xff\xfe bad"}' > "$T/bad_utf8"
expect 400 "non-UTF-8 prompt" POST /v2/models/bloom/generate --data-binary "@$T/bad_utf8"
python3 -c "print('{\"text_input\": \"' + 'word ' * 5000 + '\"}')" > "$T/long"
expect 400 "prompt too long" POST /v2/models/bloom/generate -H "Content-Type: application/json" --data-binary "@$T/long"
body_has "allows at most" "too long explains"
# Refused requests count as Triton's failures (the 6 bloom requests above: truncated JSON, wrong
# type, wrong parameter type, huge max_tokens, negative top_p, unknown field).
expect 200 "stats after the malformed requests" GET /v2/models/bloom/stats
fail_after=$(json "d['model_stats'][0]['inference_stats']['fail']['count']")
[ $((fail_after - fail_before)) -ge 6 ] || fail "refused requests not counted as failures: $fail_before -> $fail_after"
expect 404 "unknown model" POST /v2/models/nosuch/generate -d '{"text_input": "a"}'
body_has '"error"' "unknown model error JSON"
expect 404 "unknown version" POST /v2/models/bloom/versions/9/generate -d '{"text_input": "a"}'
expect 404 "../ in the model name" POST "/v2/models/..%2F..%2Fetc/generate" -d '{"text_input": "a"}'
expect 404 "../ in a repository load" POST "/v2/repository/models/..%2Fbloom/load" -d '{}'
expect 503 "broken model" POST /v2/models/broken/generate -d '{"text_input": "a"}'
expect 400 "header length past the body" POST /v2/models/bloom/infer -H "Inference-Header-Content-Length: 99999" -d '{"inputs": []}'
body_has "past the end" "header length explains"
python3 - "$T/bad_bin" <<'EOF'
import json, sys
head = json.dumps({"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1],
                               "parameters": {"binary_data_size": 8}}]}).encode()
open(sys.argv[1], "wb").write(head + b"\xff\xff\xff\x7fabcd")
open(sys.argv[1] + ".len", "w").write(str(len(head)))
EOF
expect 400 "BYTES element length past the data" POST /v2/models/bloom/infer \
  -H "Inference-Header-Content-Length: $(cat "$T/bad_bin.len")" --data-binary "@$T/bad_bin"
body_has "only" "element length explains"
expect 400 "shape and data disagree" POST /v2/models/bloom/infer -d '{"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [3], "data": ["a"]}]}'
expect 400 "wrong datatype" POST /v2/models/bloom/infer -d '{"inputs": [{"name": "text_input", "datatype": "FP32", "shape": [1], "data": [1.0]}]}'
expect 400 "unknown input" POST /v2/models/bloom/infer -d '{"inputs": [{"name": "image", "datatype": "FP32", "shape": [1], "data": [1.0]}]}'
expect 400 "beam with stop" POST /v2/models/t5/generate -d '{"text_input": "a", "beam_width": 2, "stop": ["x"]}'
head -c 20000000 /dev/zero | tr '\0' 'a' > "$T/huge"
expect 413 "body over the limit" POST /v2/models/bloom/generate -H "Content-Type: application/json" --data-binary "@$T/huge"
expect 404 "unknown route" GET /v2/nothing/here
# Garbage on the socket: the server answers 400 or closes, and stays up.
printf 'GARBAGE \x00\x01\x02 HTTP/9.9\r\n\r\n' | timeout 5 curl -s -o /dev/null "telnet://${HTTP_URL#http://}" || true
expect 200 "still live after the malformed requests" GET /v2/health/live
expect 200 "still generating after the malformed requests" POST /v2/models/bloom/generate -d '{"text_input": "add: 456 + 95", "max_tokens": 8}'
[ "$(json "d['text_output']")" = "$want1" ] || fail "generate after malformed requests"

# --- the request log has one line per finished request ---
python3 - "$TMP/requests.jsonl" <<'EOF' || fail "request log"
import json, sys
lines = [json.loads(l) for l in open(sys.argv[1])]
assert len(lines) >= 10, len(lines)
for l in lines:
    for k in ("model", "input_tokens", "output_tokens", "queue_ms", "total_ms", "finish_reason"):
        assert k in l, (k, l)
EOF

[ $fails -eq 0 ] && echo "curl: all passed" || echo "curl: $fails failure(s)"
[ $fails -eq 0 ]
