#!/usr/bin/env bash
# W8A8 (--precision int8) against the fp32 and bf16 plans at real size on the CPU: synthesizes
# bloom-560m and flan-t5-base (random weights, the public shapes), builds an fp32, a bf16 and an
# int8 plan of each (int8 calibrated on the first 128 fixture calibration prompts), and runs
# `kiln bench` over the three precisions in rotation for ROUNDS rounds (load from other
# processes falls on every precision alike): prefill (time to first token of BATCH prompts of
# INPUT_LEN tokens, one step) and decode at batch 1. Prints per (model, precision) the median
# over rounds of each round's median prefill tokens/s and decode ms/token, and the median over
# rounds of each round's ratio to bf16 and to fp32 (bench/cpu/w8a8-prefill.md keeps a run's
# numbers).
#
# Usage: bench/cpu/w8a8_prefill.sh [KILN] [WORKDIR] [ROUNDS] [BATCH] [INPUT_LEN]
set -euo pipefail
KILN="${1:-build/kiln}"
WORK="${2:-/tmp/kiln-w8a8-bench}"
ROUNDS="${3:-3}"
BATCH="${4:-4}"
INPUT_LEN="${5:-128}"
FIXTURES="${FIXTURES:-$(dirname "$0")/../../../shared/fixtures}"
PRECISIONS=(fp32 bf16 int8)
PRESETS=(bloom-560m flan-t5-base)
mkdir -p "$WORK"
head -n 128 "$FIXTURES/data/calib.jsonl" >"$WORK/calib128.jsonl"

for preset in "${PRESETS[@]}"; do
  [ -f "$WORK/$preset/config.json" ] || "$KILN" synth --preset "$preset" -o "$WORK/$preset" --seed 1 >/dev/null
  opts=()
  [ "${preset#bloom}" != "$preset" ] && opts=(--prompt-template "{prompt} =")
  for p in "${PRECISIONS[@]}"; do
    calib=()
    [ "$p" = int8 ] && calib=(--calib "$WORK/calib128.jsonl" --calib-batch 32 --calib-cache "$WORK/$preset.calib")
    [ -f "$WORK/$preset-$p.plan" ] ||
      "$KILN" -q build --model "$WORK/$preset" "${opts[@]}" --precision "$p" "${calib[@]}" \
        -o "$WORK/$preset-$p.plan"
  done
done

: >"$WORK/runs.jsonl"
for round in $(seq "$ROUNDS"); do
  for preset in "${PRESETS[@]}"; do
    for p in "${PRECISIONS[@]}"; do
      "$KILN" -q bench --plan "$WORK/$preset-$p.plan" --batch "$BATCH" --input-len "$INPUT_LEN" \
        --output-len 2 --warmup 1 --runs 3 --json |
        sed "s/^{/{\"round\":$round,\"preset\":\"$preset\",\"kind\":\"prefill\",/" >>"$WORK/runs.jsonl"
      "$KILN" -q bench --plan "$WORK/$preset-$p.plan" --batch 1 --input-len 32 --output-len 32 \
        --warmup 1 --runs 3 --json |
        sed "s/^{/{\"round\":$round,\"preset\":\"$preset\",\"kind\":\"decode\",/" >>"$WORK/runs.jsonl"
    done
  done
done

python3 - "$WORK/runs.jsonl" "$BATCH" "$INPUT_LEN" <<'PY'
import json, statistics, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
rounds = sorted({r["round"] for r in runs})
print(f"prefill: batch {sys.argv[2]} x {sys.argv[3]} tokens (time to first token); decode: batch 1 "
      f"after 32 tokens; {len(rounds)} rounds, each precision once a round, side by side")
print("ratios: the median over rounds of each round's ratio (a round's precisions ran minutes apart)")
print(f"{'model':<14} {'precision':<10} {'prefill tok/s':>14} {'vs bf16':>8} {'vs fp32':>8} "
      f"{'decode ms/tok':>14} {'vs bf16':>8} {'vs fp32':>8}")
def value(preset, p, kind, rnd):
    key = "prefill_tokens_per_s" if kind == "prefill" else "decode_ms_per_token"
    return next(r[key] for r in runs if r["preset"] == preset and r["precision"] == p
                and r["kind"] == kind and r["round"] == rnd)
for preset in dict.fromkeys(r["preset"] for r in runs):
    for p in dict.fromkeys(r["precision"] for r in runs if r["preset"] == preset):
        pf = statistics.median(value(preset, p, "prefill", r) for r in rounds)
        dec = statistics.median(value(preset, p, "decode", r) for r in rounds)
        ratio = lambda kind, base: statistics.median(
            (value(preset, p, kind, r) / value(preset, base, kind, r)) if kind == "prefill"
            else (value(preset, base, kind, r) / value(preset, p, kind, r)) for r in rounds)
        print(f"{preset:<14} {p:<10} {pf:>14.0f} {ratio('prefill', 'bf16'):>8.2f} "
              f"{ratio('prefill', 'fp32'):>8.2f} {dec:>14.1f} {ratio('decode', 'bf16'):>8.2f} "
              f"{ratio('decode', 'fp32'):>8.2f}")
PY
