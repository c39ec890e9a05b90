#!/usr/bin/env bash
# Each backend's options (its KILN_* switches, read once): `kiln inspect --device` lists the
# devices with them, with or without a plan, and `kiln bench -v` logs the plan's backend's.
source "$(dirname "$0")/lib.bash"

expect_exit 0 "inspect --device" -- "$KILN" inspect --device
expect_in "$TMP/out" "device cpu: cpu" "names the cpu backend"
expect_in "$TMP/out" "KILN_CPU_ISA=" "lists the cpu's options"
expect_in "$TMP/out" "KILN_NUM_THREADS=" "lists the cpu's threads"
expect_in "$TMP/out" "device cuda: " "names cuda, available or not"
expect_exit 0 "inspect --device with threads set" -- env KILN_NUM_THREADS=1 "$KILN" inspect --device
expect_in "$TMP/out" "KILN_NUM_THREADS=1 " "shows the value in effect"
if grep -qF "KILN_CUDA_GRAPHS=1 " "$TMP/out"; then
  # A build with CUDA: its options are read whether a GPU is visible or not.
  expect_exit 0 "inspect --device, graphs off" -- env KILN_CUDA_GRAPHS=0 KILN_CUDA_GEMV_ROWS=3 "$KILN" inspect --device
  expect_in "$TMP/out" "KILN_CUDA_GRAPHS=0 " "an A/B switch shows as set"
  expect_in "$TMP/out" "KILN_CUDA_GEMV_ROWS=3 " "a number shows as set"
  expect_exit 2 "a bad switch value" -- env KILN_CUDA_GEMV_ROWS=9 "$KILN" inspect --device
  expect_in "$TMP/err" "KILN_CUDA_GEMV_ROWS=9" "names the variable and value"
fi
expect_exit 0 "inspect --device --json" -- "$KILN" inspect --device --json
python3 - "$TMP/out" <<'PY' || fail "inspect --device --json"
import json, sys
report = json.loads(open(sys.argv[1]).read())
devices = {d["device"]: d for d in report["devices"]}
assert set(devices) == {"cpu", "cuda"}, devices
assert "KILN_CPU_ISA" in devices["cpu"]["options"], devices["cpu"]
PY

expect_exit 0 "build" -- "$KILN" build --model "$FIXTURES/bloom-tiny" -o "$TMP/b.plan"
expect_exit 0 "inspect --device with a plan" -- "$KILN" inspect --device "$TMP/b.plan"
expect_in "$TMP/out" "device cpu: cpu" "devices first"
expect_in "$TMP/out" "architecture: bloom" "then the plan"
expect_exit 0 "bench -v" -- "$KILN" -v bench --plan "$TMP/b.plan" --input-len 4 --output-len 2 --runs 1 --warmup 0
expect_in "$TMP/err" "runs with:" "logs the backend's options"
expect_in "$TMP/err" "KILN_CPU_ISA=" "the cpu's options"
expect_exit 0 "bench without -v" -- "$KILN" bench --plan "$TMP/b.plan" --input-len 4 --output-len 2 --runs 1 --warmup 0
grep -qF "KILN_CPU_ISA=" "$TMP/err" && fail "bench printed the options without -v"
finish
