#!/usr/bin/env bash
# Load and the end of requests: `kiln perf` with LOAD_CONCURRENCY (64) streaming clients for
# LOAD_SECONDS (30) on bloom with no errors, then every model's KV blocks back to 0; a client
# that hangs up mid-stream frees its KV blocks and is counted as cancelled within seconds, as
# does a request ended by a stop string or its deadline (with no other request coming); and
# SIGTERM to a second server with long generations in flight: each still completes (HTTP 200,
# kiln run's whole text), new requests get 503, the server exits 0.
# Env (run.sh): KILN, REPO, TMP, HTTP_URL, METRICS_URL, and run.sh's start_server function
# (exported). LOAD_SECONDS, LOAD_CONCURRENCY and DRAIN_TOKENS (the length of the generations
# in flight at SIGTERM) may be set.
set -uo pipefail
fails=0
fail() { echo "FAIL: $*"; fails=$((fails + 1)); }
T="$TMP/load"
mkdir -p "$T"
LOAD_SECONDS=${LOAD_SECONDS:-30}
LOAD_CONCURRENCY=${LOAD_CONCURRENCY:-64}
DRAIN_TOKENS=${DRAIN_TOKENS:-1000}
BLOOM="$REPO/bloom/1/model.plan"
T5="$REPO/t5/1/model.plan"
[ -n "${METRICS_URL:-}" ] || { echo "FAIL: the load suite needs the metrics port"; exit 1; }
declare -F start_server > /dev/null || { echo "FAIL: load.sh runs from run.sh (start_server)"; exit 1; }

# The metrics page as JSON: {"name{model}" or "name{model,reason}": value}; the helpers below
# read it with python.
cat > "$T/metrics.py" <<'EOF'
import json, re, sys, time, urllib.request

def scrape(url):
    page = urllib.request.urlopen(url, timeout=10).read().decode()
    out = {}
    for line in page.splitlines():
        m = re.match(r'^(\w+)\{([^}]*)\} (\S+)$', line)
        if not m:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        key = m.group(1) + "{" + labels.get("model", "") + ("," + labels["reason"] if "reason" in labels else "") + "}"
        out[key] = float(m.group(3))
    return out

def models(page):
    return sorted({k[k.index("{") + 1:].split(",")[0].rstrip("}") for k in page if k.startswith("kiln_kv_blocks_used{")})

def idle(page):
    """Every model: no KV blocks held, nothing running or pending."""
    ms = models(page)
    return bool(ms) and all(page[f"kiln_kv_blocks_used{{{m}}}"] == 0 and page[f"kiln_running_sequences{{{m}}}"] == 0
                            and page[f"nv_inference_pending_request_count{{{m}}}"] == 0 for m in ms)

def wait_idle(url, seconds):
    """Seconds it took for every model to be idle, or None (and the last page)."""
    start = time.time()
    while True:
        page = scrape(url)
        if idle(page):
            return time.time() - start, page
        if time.time() - start > seconds:
            return None, page
        time.sleep(0.1)

if __name__ == "__main__":
    json.dump(scrape(sys.argv[1]), sys.stdout)
EOF
metrics() { python3 "$T/metrics.py" "$1"; }
run_json() {  # run_json PLAN PROMPT N: kiln run's JSON for N tokens exactly (min = max)
  "$KILN" run -q --plan "$1" --prompt "$2" --max-new-tokens "$3" --min-new-tokens "$3" --json
}

# --- 1. load: LOAD_CONCURRENCY streaming clients for LOAD_SECONDS, no errors ---
python3 - "$FIXTURES/data/dev.jsonl" "$T/prompts.jsonl" <<'EOF'
import json, sys
rows = [json.loads(l)["prompt"] for l in open(sys.argv[1])]
with open(sys.argv[2], "w") as out:
    for p in rows[::9][:64]:  # every task
        out.write(json.dumps(p) + "\n")
EOF
metrics "$METRICS_URL" > "$T/before.json" || fail "metrics before the load"
start=$(date +%s.%N)
"$KILN" perf --url "$HTTP_URL" --model bloom --prompts "$T/prompts.jsonl" --output-len 32 --ignore-eos \
  --stream --concurrency "$LOAD_CONCURRENCY" --duration "$LOAD_SECONDS" --warmup 2 --timeout 60 --json \
  > "$T/perf.json" 2> "$T/perf.err" || fail "kiln perf exited $?: $(tail -3 "$T/perf.err")"
echo "load: kiln perf ran $(python3 -c "print(f'{$(date +%s.%N) - $start:.1f}')") s"
python3 - "$T/perf.json" "$LOAD_CONCURRENCY" <<'EOF' || fail "load results"
import json, sys
run = json.load(open(sys.argv[1]))
r = run["results"][0]
print(f"load: {r['concurrency']} streaming clients, {r['window_s']:g} s: {r['completed']} requests "
      f"({r['requests_per_s']:.1f}/s), {r['output_tokens_per_s']:.0f} output tokens/s, {r['errors']} errors")
for name, key in (("time to first token", "ttft_ms"), ("inter-token latency", "itl_ms"), ("end-to-end latency", "e2e_latency_ms")):
    print(f"load: {name:<20} p50 {r[key + '_p50']:8.2f} ms   p99 {r[key + '_p99']:8.2f} ms")
assert r["concurrency"] == int(sys.argv[2]), r["concurrency"]
assert r["errors"] == 0, f"{r['errors']} errors, the first: {r['first_error']}"
assert r["completed"] > 0, "no request completed"
# --ignore-eos: every request makes its 32 tokens, as the server's usage counts them.
assert r["output_tokens_counted_by_server"], "no usage.completion_tokens from the server"
assert r["output_tokens_per_request_p50"] == 32 and r["output_tokens_per_request_p99"] == 32 \
    and r["output_tokens_per_request_mean"] == 32, r
EOF
# kiln perf closed the connections of the requests still running when the window ended: those
# are cancelled, and then nothing may hold KV blocks.
python3 - "$T" "$METRICS_URL" <<'EOF' || fail "KV blocks after the load"
import json, sys
sys.path.insert(0, sys.argv[1])
from metrics import wait_idle
before = json.load(open(sys.argv[1] + "/before.json"))
took, page = wait_idle(sys.argv[2], 5)
print(f"load: models idle (kiln_kv_blocks_used 0, nothing running or pending) "
      f"{'after %.1f s' % took if took is not None else 'NOT within 5 s'}")
assert took is not None, {k: v for k, v in page.items() if "kv_blocks_used" in k or "running" in k or "pending" in k}
for m in ("bloom", "t5"):
    assert f"kiln_kv_blocks_used{{{m}}}" in page, f"no kiln_kv_blocks_used for {m}"
# Nothing was refused, timed out or failed under the load (CANCELED: the abandoned ones).
for reason in ("REJECTED", "BACKEND", "OTHER"):
    key = f"nv_inference_request_failure{{bloom,{reason}}}"
    assert page[key] == before[key], f"{key}: {before[key]} -> {page[key]}"
assert page["nv_inference_request_success{bloom}"] > before["nv_inference_request_success{bloom}"]
EOF
want=$("$KILN" run -q --plan "$BLOOM" --prompt "add: 456 + 95" --max-new-tokens 8 --json |
  python3 -c "import json,sys; print(json.loads(sys.stdin.readline())['text'], end='')")
got=$(curl -s "$HTTP_URL/v2/models/bloom/generate" -d '{"text_input": "add: 456 + 95", "max_tokens": 8}' |
  python3 -c "import json,sys; print(json.load(sys.stdin).get('text_output'), end='')")
[ "$got" = "$want" ] || fail "generate after the load: '$got', kiln run: '$want'"

# --- 2. a client that hangs up mid-stream (or, unstreamed, while it waits for the answer): its
# KV blocks freed, counted as cancelled ---
python3 - "$T" "$HTTP_URL" "$METRICS_URL" "$TMP/requests.jsonl" <<'EOF' || fail "client disconnect"
import json, socket, sys, time, urllib.parse
sys.path.insert(0, sys.argv[1])
from metrics import scrape, wait_idle
url, murl, log = urllib.parse.urlparse(sys.argv[2]), sys.argv[3], sys.argv[4]
# Long generations (min_tokens = max_tokens: no early EOS) that would run for many seconds.
cases = [("/v1/completions", {"model": "bloom", "prompt": "add: 456 + 95", "max_tokens": 8000,
                              "min_tokens": 8000, "stream": True}, "openai"),
         ("/v2/models/bloom/generate_stream", {"text_input": "add: 12 + 30", "max_tokens": 8000,
                                               "min_tokens": 8000}, "generate"),
         # Unstreamed: nothing is written until the end, so the server watches the socket.
         ("/v1/completions", {"model": "bloom", "prompt": "add: 456 + 95", "max_tokens": 8000,
                              "min_tokens": 8000}, "openai"),
         ("/v2/models/bloom/generate", {"text_input": "add: 12 + 30", "max_tokens": 8000,
                                        "min_tokens": 8000}, "generate")]
for path, body, protocol in cases:
    streamed = body.get("stream", False) or path.endswith("_stream")
    took, base = wait_idle(murl, 5)
    assert took is not None, "not idle before the disconnect test"
    logged = sum(1 for _ in open(log))
    data = json.dumps(body).encode()
    s = socket.create_connection((url.hostname, url.port))
    s.sendall(f"POST {path} HTTP/1.1\r\nHost: {url.netloc}\r\nContent-Type: application/json\r\n"
              f"Content-Length: {len(data)}\r\n\r\n".encode() + data)
    got = b""
    deadline = time.time() + 10
    if streamed:
        while got.count(b"\ndata: ") < 2 and time.time() < deadline:  # two events with text
            chunk = s.recv(65536)
            assert chunk, f"{path}: the server closed the stream: {got[:300]!r}"
            got += chunk
        assert got.startswith(b"HTTP/1.1 200"), got[:300]
        assert got.count(b"\ndata: ") >= 2, f"{path}: no events in 10 s: {got[:300]!r}"
    else:
        while scrape(murl)["kiln_kv_blocks_used{bloom}"] < 2 and time.time() < deadline:
            time.sleep(0.05)
    page = scrape(murl)
    assert page["kiln_kv_blocks_used{bloom}"] > 0 and page["kiln_running_sequences{bloom}"] == 1, \
        f"{path}: the request holds no KV blocks while it streams"
    s.close()  # streamed: unread data, the kernel sends RST; unstreamed: FIN
    hung_up = time.time()
    took, page = wait_idle(murl, 3)
    cancelled = page["nv_inference_request_failure{bloom,CANCELED}"] - base["nv_inference_request_failure{bloom,CANCELED}"]
    print(f"disconnect ({path}): "
          + (f"KV blocks freed {took * 1000:.0f} ms after the client hung up" if took is not None
             else "KV blocks NOT freed within 3 s") + f", cancelled +{cancelled:g}")
    assert took is not None, {k: v for k, v in page.items() if "{bloom" in k and ("kv" in k or "running" in k)}
    assert cancelled == 1, f"{path}: CANCELED +{cancelled:g}, expected +1"
    assert page["nv_inference_request_success{bloom}"] == base["nv_inference_request_success{bloom}"]
    # The request log has the line, with the tokens made before the client left.
    for _ in range(20):
        lines = [json.loads(l) for l in list(open(log))[logged:]]
        if lines:
            break
        time.sleep(0.1)
    assert len(lines) == 1, lines
    assert lines[0]["finish_reason"] == "cancelled" and lines[0]["protocol"] == protocol, lines[0]
    assert 1 <= lines[0]["output_tokens"] < 8000, lines[0]
EOF

# --- 3. requests the server ends early (a stop string, a deadline) free their KV blocks at
# once, with no other request coming to step the engine ---
full=$(run_json "$BLOOM" "add: 456 + 95" 16 | python3 -c "import json,sys; print(json.loads(sys.stdin.readline())['text'], end='')")
python3 - "$T" "$HTTP_URL" "$METRICS_URL" "${full:6:3}" <<'EOF' || fail "early ends"
import json, sys, time, urllib.error, urllib.request
sys.path.insert(0, sys.argv[1])
from metrics import scrape, wait_idle
url, murl, stop = sys.argv[2:5]
assert len(stop) == 3, f"kiln run's text is too short for a stop string: {stop!r}"
def post(body):
    req = urllib.request.Request(url + "/v2/models/bloom/generate", json.dumps(body).encode())
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, json.load(r)
    except urllib.error.HTTPError as e:
        return e.code, json.load(e)
long = {"text_input": "add: 456 + 95", "max_tokens": 8000, "min_tokens": 8000}
for what, body, status in (("stop string", dict(long, stop=[stop]), 200), ("deadline", dict(long, timeout=300_000), 504)):
    assert wait_idle(murl, 5)[0] is not None, "not idle before"
    code, j = post(body)
    assert code == status, f"{what}: HTTP {code}, expected {status}: {j}"
    if what == "stop string":
        assert j["finish_reason"] == "stop" and stop not in j["text_output"], j
    took, page = wait_idle(murl, 2)
    print(f"early end ({what}): " + (f"KV blocks freed within {took * 1000:.0f} ms" if took is not None
                                     else f"KV blocks NOT freed within 2 s: {page['kiln_kv_blocks_used{bloom}']:g} used"))
    assert took is not None, what
EOF

# --- 4. SIGTERM with generations in flight: they finish, new requests get 503, exit 0 ---
# A repository of its own: the same plans, bloom stepping at most 2 sequences together, so that
# at SIGTERM some requests are running and some are still queued (both must finish). The
# server runs its steps on one thread (--threads 1), as does `kiln run` for the expected texts
# (the same tokens as with more threads): with a core taken by another process (a build, another
# test) a 2-thread pool waits for its descheduled worker at every step and runs many times
# slower.
D="$T/drain"
mkdir -p "$D/repo/bloom/1" "$D/repo/t5/1"
cp "$BLOOM" "$D/repo/bloom/1/model.plan"
cp "$T5" "$D/repo/t5/1/model.plan"
printf 'platform: "kiln_plan"\nmax_batch_size: 2\n' > "$D/repo/bloom/config.pbtxt"
start_server drain --model-repository "$D/repo" --drain-timeout 60 --threads 1 || { fail "drain server"; exit 1; }
DRAIN_HTTP=$drain_HTTP
# One client process sends the requests together (non-streamed and streamed, OpenAI's and
# Triton's), sends SIGTERM once the server has every one enqueued (running or queued), checks
# that new requests are refused meanwhile, and then that every request got HTTP 200 and kiln
# run's whole text (no EOS: min_tokens = max_tokens; t5 makes its tokens faster, it asks for more).
cat > "$D/client.py" <<'EOF'
import collections, json, os, re, signal, subprocess, sys, threading, time, urllib.error, urllib.parse, urllib.request
sys.path.insert(0, os.environ["T"])
from metrics import scrape
http, murl, pid, log, n = os.environ["DRAIN_HTTP"], os.environ["drain_METRICS"], int(os.environ["drain_PID"]), os.environ["DRAIN_LOG"], int(os.environ["DRAIN_TOKENS"])
reqs = [  # name, model, path, tokens, the prompt for kiln run, the body
    ("t5", "t5", "/v2/models/t5/generate", 3 * n, "reverse: suvogi", {"text_input": "reverse: suvogi"}),
    ("openai", "bloom", "/v1/completions", n, "add: 456 + 95", {"model": "bloom", "prompt": "add: 456 + 95"}),
    ("generate", "bloom", "/v2/models/bloom/generate", n, "add: 12 + 30", {"text_input": "add: 12 + 30"}),
    ("openai-stream", "bloom", "/v1/completions", n, "sort: 5 3 9", {"model": "bloom", "prompt": "sort: 5 3 9", "stream": True}),
    ("chat-stream", "bloom", "/v1/chat/completions", n, "add: 456 + 95",
     {"model": "bloom", "messages": [{"role": "user", "content": "add: 456 + 95"}], "stream": True}),
    ("generate-stream", "bloom", "/v2/models/bloom/generate_stream", n, "upper: abc", {"text_input": "upper: abc"}),
]

def post(path, body):
    """(status, body text) of a POST; HTTP errors too."""
    req = urllib.request.Request(http + path, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=300) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except Exception as e:  # a connection reset: the server closed a request in flight
        return 0, repr(e)

results = {}
def send(name, path, body):
    results[name] = post(path, body)
threads = []
for name, model, path, tokens, prompt, body in reqs:
    body.update(max_tokens=tokens, min_tokens=tokens)
    threads.append(threading.Thread(target=send, args=(name, path, body)))
    threads[-1].start()

want = collections.Counter(r[1] for r in reqs)
deadline = time.time() + 20
while True:
    page = scrape(murl)
    got = {m: page[f"kiln_running_sequences{{{m}}}"] + page[f"nv_inference_pending_request_count{{{m}}}"] for m in want}
    if got == want:
        break
    assert time.time() < deadline, f"in flight: {got}, expected {dict(want)}"
    time.sleep(0.005)
os.kill(pid, signal.SIGTERM)
sigterm = time.time()
fails = []
for _ in range(200):
    m = re.search(r"draining \(up to \d+ s for (\d+) requests in flight\)", open(log).read())
    if m:
        break
    time.sleep(0.01)
inflight = int(m.group(1)) if m else None
print(f"drain: SIGTERM with {inflight} requests in flight (of {len(reqs)}: bloom runs 2 at a time, the rest queue)")
if inflight != len(reqs):
    fails.append(f"{inflight} requests in flight at SIGTERM, expected {len(reqs)} (too short: raise DRAIN_TOKENS)")
# While draining: new requests are refused with 503 (OpenAI's error on /v1), the model not ready.
code, text = post("/v2/models/bloom/generate", {"text_input": "add: 1 + 2", "max_tokens": 2})
if code != 503:
    fails.append(f"a new generate while draining: HTTP {code}, expected 503: {text[:200]}")
code, text = post("/v1/completions", {"model": "bloom", "prompt": "add: 1 + 2"})
if code != 503 or "message" not in json.loads(text or "{}").get("error", {}):
    fails.append(f"a new completion while draining: HTTP {code}, expected 503 with OpenAI's error: {text[:200]}")
try:
    code = urllib.request.urlopen(http + "/v2/models/bloom/ready", timeout=10).status
except urllib.error.HTTPError as e:
    code = e.code
except Exception as e:
    code = repr(e)
if code != 400:
    fails.append(f"bloom ready while draining: {code}, expected HTTP 400")

for t in threads:
    t.join()
print(f"drain: the last request finished {time.time() - sigterm:.1f} s after SIGTERM")
repo = os.environ["REPO"]
for name, model, path, tokens, prompt, body in reqs:
    out = subprocess.run([os.environ["KILN"], "run", "-q", "--threads", "1", "--plan", f"{repo}/{model}/1/model.plan",
                          "--prompt", prompt, "--max-new-tokens", str(tokens), "--min-new-tokens", str(tokens), "--json"],
                         check=True, capture_output=True, text=True)
    expected = json.loads(out.stdout.splitlines()[-1])
    code, text = results[name]
    try:
        assert code == 200, f"HTTP {code}: {text[:300]}"
        if body.get("stream") or path.endswith("generate_stream"):
            events = [l[6:] for l in text.splitlines() if l.startswith("data: ")]
            if path.startswith("/v1/"):  # OpenAI's streams end with [DONE], Triton's do not
                assert events and events[-1] == "[DONE]", f"no [DONE] at the end: {text[-200:]!r}"
                events.pop()
            events = [json.loads(e) for e in events]
            assert events, "no events"
            assert not any("error" in e for e in events), [e for e in events if "error" in e]
            if path.endswith("generate_stream"):
                got, finish = "".join(e["text_output"] for e in events), events[-1]["finish_reason"]
            else:
                choices = [c for e in events for c in e["choices"]]
                got = "".join(c.get("text") or c.get("delta", {}).get("content") or "" for c in choices)
                finish = choices[-1]["finish_reason"]
        else:
            j = json.loads(text)
            if path.startswith("/v2/"):
                got, finish = j["text_output"], j["finish_reason"]
            else:
                got, finish = j["choices"][0]["text"], j["choices"][0]["finish_reason"]
                assert j["usage"]["completion_tokens"] == len(expected["output_ids"]), j["usage"]
        assert got == expected["text"], f"{len(got)} chars, kiln run: {len(expected['text'])}: {got[:60]!r} vs {expected['text'][:60]!r}"
        assert finish == "length", f"finish_reason {finish}"
        print(f"drain: {name} ({path}): HTTP 200, kiln run's {tokens} tokens")
    except AssertionError as e:
        fails.append(f"{name} ({path}): {e}")
for f in fails:
    print(f"FAIL: {f}")
sys.exit(1 if fails else 0)
EOF
SECONDS=0
T=$T DRAIN_HTTP=$drain_HTTP drain_METRICS=$drain_METRICS drain_PID=$drain_PID DRAIN_LOG="$TMP/drain.err" \
  DRAIN_TOKENS=$DRAIN_TOKENS python3 "$D/client.py" || fail "requests in flight at SIGTERM"
# The server exits by itself; after 60 s more it is killed (a zombie is one that has exited).
for _ in $(seq 1 600); do
  state=$(awk '{print $3}' "/proc/$drain_PID/stat" 2> /dev/null)
  [ -z "$state" ] || [ "$state" = Z ] && break
  sleep 0.1
done
[ -z "$state" ] || [ "$state" = Z ] || { fail "the drained server still runs 60 s after its requests finished"; kill -KILL "$drain_PID"; }
wait "$drain_PID"
code=$?
echo "drain: the server exited $code (${SECONDS} s for this part)"
[ "$code" -eq 0 ] || fail "the drained server exited $code, expected 0: $(tail -5 "$TMP/drain.err")"
grep -q "kiln serve: stopped" "$TMP/drain.out" || fail "the drained server did not say it stopped"
grep -q "drain timeout" "$TMP/drain.err" && fail "the drain timed out: requests were cancelled"

[ $fails -eq 0 ] && echo "load: all passed" || echo "load: $fails failure(s)"
[ $fails -eq 0 ]
