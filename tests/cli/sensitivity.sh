#!/usr/bin/env bash
# The sensitivity fallback of `kiln build --precision int8` on t5-tiny: a tight --quant-tolerance
# keeps layers float, the build log lists every quantized layer's measured error and which stay
# float, the cache records them (quant-tolerance= and `float` lines), `kiln inspect --layers`
# shows each layer's precision and, for the float ones, their measured error as the reason; a
# cache-only rebuild keeps the same layers (the same ids), `--quant-tolerance off` drops them, the
# fallback plan stays within two points of fp32 on the dev set; bad values are refused (exit 2)
# naming the option, before any work.
source "$(dirname "$0")/lib.bash"

CALIB="$FIXTURES/data/calib.jsonl"
DEV="$FIXTURES/data/dev.jsonl"
MODEL="$FIXTURES/t5-tiny"
head -n 60 "$DEV" | python3 -c '
import json, sys
for line in sys.stdin:
    print(json.dumps(json.loads(line)["prompt"]))' >"$TMP/prompts.jsonl"

fp32="$TMP/fp32.plan" fb="$TMP/fallback.plan" cache="$TMP/t5.calib"
expect_exit 0 "build fp32" -- "$KILN" build --model "$MODEL" -o "$fp32"
expect_exit 0 "build int8 --quant-tolerance 1e-5" -- "$KILN" build --model "$MODEL" \
  --precision int8 --calib "$CALIB" --calib-cache "$cache" --quant-tolerance 1e-5 \
  --sensitivity-prompts 16 -o "$fb"
expect_in "$TMP/err" "each measured alone against fp32 on 16 prompts" "the log says what is measured"
expect_in "$TMP/err" "kept float" "the log marks the layers kept float"
expect_in "$TMP/err" "--quant-tolerance 1e-05" "the log names the tolerance"
expect_in "$TMP/err" "sensitivity: encoder.block.0.layer.0.SelfAttention.qkv" "the log lists every layer"
expect_in "$cache" "quant-tolerance=1e-05" "the cache records the tolerance"
expect_in "$cache" "float " "the cache records the layers kept float"

expect_exit 0 "inspect --layers --json" -- "$KILN" inspect --layers --json "$fb" &&
  cp "$TMP/out" "$TMP/inspect.json"
python3 - "$TMP/inspect.json" "$cache" <<'PY' || fail "inspect reports every layer's precision and why"
import json, sys
report = json.loads(open(sys.argv[1]).readline())
kept = {}
for line in open(sys.argv[2]):
    w = line.split()
    if w and w[0] == "float":
        kept[w[1]] = float(w[2])
assert kept, "the cache keeps no layer float"
seen = set()
for g in report["graphs"]:
    for layer in g["precision"]["layers"]:
        name = layer["layer"]
        if name in kept:
            seen.add(name)
            assert layer["dtype"] == "f32" and layer["compute"] == "f32", layer
            assert "sensitivity fallback" in layer["why"], layer
            assert f"{kept[name]:.3g}" in layer["why"], (kept[name], layer["why"])
        else:
            assert layer["dtype"].startswith("i8"), layer
assert seen == set(kept), (seen, kept)
print(f"{len(kept)} layers float:", ", ".join(sorted(kept)))
PY
expect_exit 0 "inspect --layers" -- "$KILN" inspect --layers "$fb" &&
  expect_in "$TMP/out" "sensitivity fallback: int8 alone moves" "inspect's table says why"

# A cache-only rebuild keeps the same layers: the same ids.
expect_exit 0 "rebuild from the cache" -- "$KILN" build --model "$MODEL" --precision int8 \
  --calib-cache "$cache" -o "$TMP/again.plan" &&
  expect_in "$TMP/err" "sensitivity fallback from $cache" "the rebuild says where the layers come from"
for p in "$fb" "$TMP/again.plan"; do
  expect_exit 0 "run $(basename "$p")" -- "$KILN" run --plan "$p" --input "$TMP/prompts.jsonl" --json &&
    cp "$TMP/out" "$p.run.jsonl"
done
cmp -s "$fb.run.jsonl" "$TMP/again.plan.run.jsonl" ||
  fail "the cache-only rebuild generates other ids than the fallback plan"
# --quant-tolerance off on a cache-only build: every layer int8.
expect_exit 0 "rebuild with the fallback off" -- "$KILN" build --model "$MODEL" --precision int8 \
  --calib-cache "$cache" --quant-tolerance off -o "$TMP/off.plan"
expect_exit 0 "inspect off" -- "$KILN" inspect --layers "$TMP/off.plan" &&
  { grep -q "sensitivity fallback" "$TMP/out" && fail "the 'off' plan keeps layers float"; }
# ... and with --calib: no sensitivity pass, a cache without the fallback.
expect_exit 0 "build with the fallback off" -- "$KILN" build --model "$MODEL" --precision int8 \
  --calib "$CALIB" --calib-cache "$TMP/off.calib" --quant-tolerance off -o "$TMP/off2.plan" &&
  expect_in "$TMP/err" "sensitivity fallback off" "the log says the fallback is off"
grep -q "each measured alone" "$TMP/err" && fail "--quant-tolerance off measured layers"
grep -q "quant-tolerance" "$TMP/off.calib" && fail "the 'off' cache records a tolerance"

# Dev accuracy: fp32 vs the fallback plan, within two points.
expect_exit 0 "eval --compare fp32 fallback" -- "$KILN" eval --compare "$fp32" "$fb" \
  --dataset "$DEV" --max-drop 0.02 --json && cp "$TMP/out" "$TMP/compare.json"
python3 - "$TMP/compare.json" <<'PY' || fail "eval --compare of the fallback plan"
import json, sys
j = json.loads(open(sys.argv[1]).readline())
a, b = j["a"]["overall"], j["b"]["overall"]
print(f"t5: fp32 {a:.4f}  fallback {b:.4f}  top-1 agreement {j['top1_agreement']:.4f}")
assert j["n"] == 600 and j["passed"], j
PY

# Bad values: refused before any work, naming the option.
bad() {  # bad DESCRIPTION EXPECTED-TEXT ARGS...
  local what="$1" text="$2"
  shift 2
  expect_exit 2 "$what" -- "$KILN" build --model "$MODEL" -o "$TMP/bad.plan" "$@" &&
    expect_in "$TMP/err" "$text" "$what: the message"
  [ -e "$TMP/bad.plan" ] && fail "$what: a plan was written"
  grep -q "calibrating" "$TMP/err" && fail "$what: calibration ran"
}
bad "negative tolerance" "--quant-tolerance" --precision int8 --calib "$CALIB" --quant-tolerance -0.1
bad "tolerance not a number" "--quant-tolerance 'abc'" --precision int8 --calib "$CALIB" \
  --quant-tolerance abc
bad "tolerance nan" "--quant-tolerance" --precision int8 --calib "$CALIB" --quant-tolerance nan
bad "zero sensitivity prompts" "--sensitivity-prompts 0" --precision int8 --calib "$CALIB" \
  --sensitivity-prompts 0
bad "sensitivity prompts without --calib" "give --calib" --precision int8 --calib-cache "$cache" \
  --sensitivity-prompts 8
bad "another tolerance on a cache-only build" "needs the calibration prompts" --precision int8 \
  --calib-cache "$cache" --quant-tolerance 0.5
bad "tolerance for bf16" "--precision bf16" --precision bf16 --quant-tolerance 0.01
finish
