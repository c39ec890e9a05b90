#!/bin/bash
# An fp8 KV cache (--kv-cache fp8) against the fp16 cache of the same fp16 plan, in one device
# run: `kiln bench` decode at batch 1 and 64 after prompts of CONTEXT tokens (default 1024: long
# decodes read mostly KV), the time to first token, and the greedy tokens' agreement of the two
# plans on the fixture dev set (`kiln eval --compare`; the weights are random, so only the
# agreement means something). bloom-560m by default (MODELS="bloom-560m flan-t5-large"; T5 in
# bf16). Run from the folder scripts/device/pack.sh filled. Usage: kv_fp8.sh [RUNS]
# Logs and JSON lines in $OUT/kv_fp8.{log,jsonl}.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}
RUNS=${1:-2}
CONTEXT=${CONTEXT:-1024}
source "$HERE/bundle_env.sh"
LOG="$OUT/kv_fp8.log"
JSON="$OUT/kv_fp8.jsonl"
mkdir -p /tmp/synth /tmp/plans
date -u | tee -a "$LOG"
for preset in ${MODELS:-bloom-560m}; do
  case "$preset" in
    bloom-*) sdtype=fp16 prec=fp16 ;;
    *) sdtype=fp32 prec=bf16 ;;
  esac
  dir=/tmp/synth/$preset
  [ -d "$dir" ] || "$KILN" synth --preset "$preset" --dtype "$sdtype" -o "$dir" >>"$LOG" 2>&1
  for kv in auto fp8; do
    plan=/tmp/plans/$preset-$prec-kv-$kv.plan
    "$KILN" build --model "$dir" --device cuda --precision "$prec" --kv-cache "$kv" \
      --max-input-tokens $((CONTEXT + 64)) -o "$plan" >>"$LOG" 2>&1 ||
      { echo "build $preset kv $kv failed" | tee -a "$LOG"; continue; }
    "$KILN" bench --plan "$plan" --input-len "$CONTEXT" --output-len 64 --runs "$RUNS" \
      --sweep batch=1,16,64 --json 2>>"$LOG" | tee -a "$JSON" | python3 -c '
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print("  %s kv %s batch %-3s decode %.3f ms/token  roofline %.1f %%  ttft %.2f ms  "
          "kv %.1f MB  peak %.1f MB" % (
        sys.argv[1], r.get("kv_cache"), r.get("batch"), r.get("decode_ms_per_token", float("nan")),
        r.get("roofline_pct", float("nan")), r.get("ttft_ms", float("nan")),
        r.get("kv_cache_bytes", 0) / 1e6, r.get("peak_memory_bytes", 0) / 1e6))' "$preset" | tee -a "$LOG"
  done
  a=/tmp/plans/$preset-$prec-kv-auto.plan b=/tmp/plans/$preset-$prec-kv-fp8.plan
  [ -f "$a" ] && [ -f "$b" ] &&
    "$KILN" eval --compare "$a" "$b" --dataset "$HERE/x/fixtures/data/dev.jsonl" \
      --max-new-tokens 8 --json 2>>"$LOG" | sed "s/^{/{\"model\": \"$preset\", /" |
    tee -a "$JSON" | tee -a "$LOG"
done
