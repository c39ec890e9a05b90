#!/usr/bin/env bash
# `kiln calibrate` on both fixture models: a cache with one scale per Linear input, each method,
# the log counting prompts and tokens; bad --calib files and methods refused (exit 2) naming
# the line or the value.
source "$(dirname "$0")/lib.bash"

CALIB="$FIXTURES/data/calib.jsonl"
head -n 24 "$CALIB" >"$TMP/calib24.jsonl"
for model in t5 bloom; do
  opts=()
  [ "$model" = bloom ] && opts=(--prompt-template "{prompt} =")
  plan="$TMP/$model.plan"
  expect_exit 0 "build $model" -- "$KILN" build --model "$FIXTURES/$model-tiny" "${opts[@]}" -o "$plan" || continue
  for method in entropy minmax percentile:99.99; do
    cache="$TMP/$model-${method%%:*}.calib"
    expect_exit 0 "calibrate $model $method" -- "$KILN" calibrate -v --plan "$plan" \
      --calib "$TMP/calib24.jsonl" --calib-method "$method" --calib-batch 5 -o "$cache" || continue
    expect_in "$TMP/err" "24 prompts" "$model $method: the log counts the prompts"
    expect_in "$cache" "method=$method" "$model $method: the header names the method"
    python3 - "$cache" <<'PY' || fail "$model $method: cache format"
import sys
lines = open(sys.argv[1]).read().splitlines()
assert lines[0].startswith("kiln-calibration-cache 1 model="), lines[0]
assert len(lines) > 5, len(lines)
for line in lines[1:]:
    name, scale = line.split(" ")
    assert "/" in name and float(scale) > 0, line
PY
  done
done
plan="$TMP/t5.plan"
printf '' >"$TMP/empty.jsonl"
expect_exit 2 "empty --calib" -- "$KILN" calibrate --plan "$plan" --calib "$TMP/empty.jsonl" -o "$TMP/x.calib" &&
  expect_in "$TMP/err" "no calibration prompts" "empty --calib"
printf '{"prompt": "a"}\nnot json\n' >"$TMP/notjson.jsonl"
expect_exit 2 "not JSON" -- "$KILN" calibrate --plan "$plan" --calib "$TMP/notjson.jsonl" -o "$TMP/x.calib" &&
  expect_in "$TMP/err" "notjson.jsonl:2" "not JSON names the line"
printf '{"prompt": "a"}\n{"prompt": "caf\xe9"}\n' >"$TMP/latin1.jsonl"
expect_exit 2 "not UTF-8" -- "$KILN" calibrate --plan "$plan" --calib "$TMP/latin1.jsonl" -o "$TMP/x.calib" &&
  expect_in "$TMP/err" "latin1.jsonl:2" "not UTF-8 names the line"
printf '{"task": "add"}\n' >"$TMP/nofield.jsonl"
expect_exit 2 "no field" -- "$KILN" calibrate --plan "$plan" --calib "$TMP/nofield.jsonl" -o "$TMP/x.calib" &&
  expect_in "$TMP/err" "nofield.jsonl:1" "a missing field names the line"
expect_exit 2 "bad method" -- "$KILN" calibrate --plan "$plan" --calib "$CALIB" --calib-method kl -o "$TMP/x.calib" &&
  expect_in "$TMP/err" "unknown calibration method 'kl'" "bad method"
[ -e "$TMP/x.calib" ] && fail "a refused calibration left a cache behind"
finish
