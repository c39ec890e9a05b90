#!/usr/bin/env bash
# The AVX2 family end to end (ctest label avx2: run with KILN_CPU_ISA=avx2 and
# ONEDNN_MAX_CPU_ISA=AVX2, so an AVX-512 machine runs the kernels an AVX2-only CPU runs): a plan of
# each CPU precision is built and benchmarked with `kiln bench --json` at 2 sequences of a
# 40-token prompt (80 prompt rows: the narrow weights' prefill through oneDNN's f32 sgemm; decode
# at 2 rows: the tiles and, for int8-weight and int4-weight, the integer dot products; int8
# (W8A8, calibrated on 32 prompts) runs its vpmaddwd tiles at every row count), every measurement present
# and plausible (no timing is asserted against a target), and the engine says it runs avx2 kernels.
source "$(dirname "$0")/../cli/lib.bash"

[ "${KILN_CPU_ISA:-}" = avx2 ] || fail "KILN_CPU_ISA=avx2 is not set (ctest sets it)"
[ "${ONEDNN_MAX_CPU_ISA:-}" = AVX2 ] || fail "ONEDNN_MAX_CPU_ISA=AVX2 is not set (ctest sets it)"
head -n 32 "$FIXTURES/data/calib.jsonl" >"$TMP/calib32.jsonl"
for p in fp32 bf16 fp16 int8-weight int4-weight int8; do
  plan="$TMP/bloom-$p.plan"
  calib=()
  [ "$p" = int8 ] && calib=(--calib "$TMP/calib32.jsonl")
  expect_exit 0 "build $p" -- "$KILN" build --model "$FIXTURES/bloom-tiny" --precision "$p" "${calib[@]}" \
    -o "$plan" -q || continue
  # Built for AVX2: no weights packed for the AVX-512 kernels.
  expect_exit 0 "inspect $p" -- "$KILN" inspect "$plan"
  grep -q "avx512" "$TMP/out" && fail "$p: the plan is packed for avx512: $(grep avx512 "$TMP/out" | head -3)"
  expect_exit 0 "bench $p" -- "$KILN" -v bench --plan "$plan" --batch 2 --input-len 40 --output-len 3 --runs 1 --warmup 0 --json || continue
  expect_in "$TMP/err" "avx2 kernels" "$p: the engine's kernel family"
  python3 - "$TMP/out" "$p" <<'PY' || fail "bench $p --json"
import json, math, sys
r = json.loads(open(sys.argv[1]).readline())
p = sys.argv[2]
assert r["precision"] == p and r["device"] == "cpu" and r["batch"] == 2 and r["input_len"] == 40, r
for k in ["load_ms", "ttft_ms", "decode_ms_per_token", "tokens_per_s", "bandwidth_gbps",
          "roofline_pct", "bytes_per_step", "onednn_linear_ms", "prefill_vs_onednn_pct"]:
    assert math.isfinite(r[k]) and r[k] > 0, (k, r[k])
# oneDNN capped at AVX2 has f32 and u8 x s8 GEMMs, no bf16 one: bf16 plans are set against f32.
want = {"fp32": "f32", "bf16": "f32", "fp16": "f32", "int8-weight": "u8s8", "int4-weight": "u8s8",
        "int8": "u8s8"}[p]
assert r["onednn_dtype"] == want, (r["onednn_dtype"], want)
# Weights at the plan's precision: bloom-tiny holds ~18 MiB of f32 (int4-weight: half a byte a
# weight but for the int8 table, which is ~5 % of them).
per = {"fp32": 4, "bf16": 2, "fp16": 2, "int8-weight": 1, "int4-weight": 0.5, "int8": 1}[p]
assert 17 * 2**20 * per / 4 < r["weight_bytes"] < 40 * 2**20 * per / 4, r["weight_bytes"]
PY
done
finish
