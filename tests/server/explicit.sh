#!/usr/bin/env bash
# Model control mode explicit: only --load-model models at start; the repository API loads and
# unloads; a model that cannot load says why and the others keep serving.
# Env (run.sh): HTTP_URL, TMP.
set -uo pipefail
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
B="$TMP/explicit_body"
code() { local m=$1 p=$2; shift 2; curl -s -o "$B" -w '%{http_code}' -X "$m" "$HTTP_URL$p" "$@"; }
expect() { local want=$1 what=$2; shift 2; local got; got=$(code "$@"); [ "$got" = "$want" ] || fail "$what: HTTP $got, expected $want: $(head -c 300 "$B")"; }

expect 200 "ready (explicit mode: what was asked is loaded)" GET /v2/health/ready
expect 200 "t5 loaded at start" GET /v2/models/t5/ready
expect 400 "bloom not loaded yet" GET /v2/models/bloom/ready
expect 503 "bloom not loaded: generate" POST /v2/models/bloom/generate -d '{"text_input": "a"}'
expect 200 "load bloom" POST /v2/repository/models/bloom/load -d '{}'
expect 200 "bloom ready after load" GET /v2/models/bloom/ready
expect 200 "bloom generates" POST /v2/models/bloom/generate -d '{"text_input": "add: 1 + 2", "max_tokens": 4}'
expect 400 "load broken" POST /v2/repository/models/broken/load -d '{}'
grep -q "broken" "$B" || fail "broken load names the model"
expect 404 "load unknown" POST /v2/repository/models/nosuch/load -d '{}'
expect 200 "unload bloom" POST /v2/repository/models/bloom/unload -d '{}'
expect 400 "bloom not ready after unload" GET /v2/models/bloom/ready
expect 404 "unload again" POST /v2/repository/models/bloom/unload -d '{}'
expect 200 "t5 still serves" POST /v2/models/t5/generate -d '{"text_input": "reverse: abc", "max_tokens": 4}'
expect 200 "index" POST /v2/repository/index -d '{}'
python3 -c "
import json
idx = {e['name']: e for e in json.load(open('$B'))}
assert idx['t5']['state'] == 'READY', idx
assert idx['bloom']['state'] == 'UNAVAILABLE', idx
assert 'broken' in idx and idx['broken']['reason'], idx
" || fail "explicit index: $(cat "$B")"
[ $fails -eq 0 ] && echo "explicit: all passed" || echo "explicit: $fails failure(s)"
[ $fails -eq 0 ]
