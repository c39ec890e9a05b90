#!/usr/bin/env bash
# kiln bench reports every field of its contract, with plausible values (never timings asserted
# against a target: only that they were measured), for a sweep and a single configuration.
source "$(dirname "$0")/lib.bash"

expect_exit 0 "build" -- "$KILN" build --model "$FIXTURES/bloom-tiny" -o "$TMP/b.plan" -q
expect_exit 0 "bench sweep --json" -- "$KILN" bench --plan "$TMP/b.plan" --input-len 12 --output-len 5 --runs 1 --warmup 0 --sweep batch=1,3 --json
python3 - "$TMP/out" <<'PY' || fail "bench --json fields"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["batch"] for r in rows] == [1, 3], rows
need = ["model", "precision", "device", "batch", "input_len", "output_len", "load_ms", "ttft_ms",
        "decode_ms_per_token", "tokens_per_s", "prefill_tokens_per_s", "peak_memory_bytes",
        "bandwidth_gbps", "bytes_per_step", "roofline_pct"]
for r in rows:
    missing = [k for k in need if k not in r]
    assert not missing, missing
    assert r["precision"] == "fp32" and r["device"] == "cpu" and r["input_len"] == 12
    for k in ["load_ms", "ttft_ms", "decode_ms_per_token", "tokens_per_s", "bandwidth_gbps", "roofline_pct"]:
        assert r[k] > 0, (k, r[k])
    # bytes per step: at least every decoder weight once (about 18 MiB of f32 for bloom-tiny)
    assert r["bytes_per_step"] > 18e6, r["bytes_per_step"]
assert rows[1]["bytes_per_step"] > rows[0]["bytes_per_step"], "more sequences read more KV"
# The load's parts: the plan's own load is read + weights + compile; the backend apart.
for r in rows:
    parts = r["load_parts_ms"]
    assert set(parts) == {"read", "weights", "compile"}, parts
    assert all(v >= 0 for v in parts.values()) and r["context_ms"] >= 0, r
    assert abs(sum(parts.values()) - r["load_ms"]) < 1e-6 * r["load_ms"] + 1e-9, r
# The prompt step against oneDNN's GEMMs on its Linear shapes (CPU plans): bloom-tiny's prompt of
# 12 tokens runs 2 * 12 * (its layer Linears' weights) plus the lm_head's one row a sequence.
for r in rows:
    assert r["onednn_dtype"] == "f32", r["onednn_dtype"]
    for k in ["prefill_linear_gflop", "onednn_linear_ms", "prefill_vs_onednn_pct"]:
        assert r[k] > 0, (k, r[k])
    assert abs(r["prefill_vs_onednn_pct"] - 100 * r["onednn_linear_ms"] / r["ttft_ms"]) < 1e-6 * r["prefill_vs_onednn_pct"] + 1e-9
assert 2.5 < rows[1]["prefill_linear_gflop"] / rows[0]["prefill_linear_gflop"] < 3.5, "3 prompts: 3x the FLOPs"
# Memory: the plan's weights (bloom-tiny: ~18 MiB of f32) and the KV cache the runs filled, and
# each configuration's own peak, which leaves out the bandwidth probe's 1 GiB buffer before it.
for r in rows:
    assert 17 * 2**20 < r["weight_bytes"] < 40 * 2**20, r["weight_bytes"]
    assert r["kv_cache_bytes"] > 0 and r["kv_cache"] == "auto", (r["kv_cache_bytes"], r["kv_cache"])
    assert r["weight_bytes"] / 2 < r["peak_memory_bytes"] < 512 * 2**20, r["peak_memory_bytes"]
    want = 100 * (r["peak_memory_bytes"] / (r["weight_bytes"] + r["kv_cache_bytes"]) - 1)
    assert abs(r["peak_over_weights_kv_pct"] - want) < 1e-6 * abs(want) + 1e-6, r
assert 2.5 < rows[1]["kv_cache_bytes"] / rows[0]["kv_cache_bytes"] < 3.5, "3 sequences: 3x the KV"
PY
# An int8-weight plan is set against oneDNN's int8 GEMM (u8 x s8; f32 where oneDNN has only its
# reference code for it).
expect_exit 0 "build int8-weight" -- "$KILN" build --model "$FIXTURES/bloom-tiny" --precision int8-weight -o "$TMP/i8.plan" -q
expect_exit 0 "bench int8-weight --json" -- "$KILN" bench --plan "$TMP/i8.plan" --input-len 12 --output-len 3 --runs 1 --warmup 0 --json
python3 - "$TMP/out" <<'PY' || fail "bench int8-weight oneDNN reference"
import json, sys
r = json.loads(open(sys.argv[1]).readline())
assert r["precision"] == "int8-weight" and r["onednn_dtype"] in ("u8s8", "f32"), r
assert r["onednn_linear_ms"] > 0 and r["prefill_vs_onednn_pct"] > 0, r
PY
expect_exit 0 "bench table" -- "$KILN" bench --plan "$TMP/b.plan" --input-len 8 --output-len 3 --runs 1
expect_in "$TMP/out" "roofline" "table header"
expect_in "$TMP/out" "GB/s" "measured bandwidth"
expect_in "$TMP/out" "vs oneDNN" "the prompt step against oneDNN"
expect_in "$TMP/out" "w+kv+" "peak memory against weights + KV cache"
# A bf16 plan on a CPU without AVX-512, where oneDNN has no bf16 GEMM (forced on any machine:
# kiln's AVX2 kernels, oneDNN capped at AVX2): the measured results are still printed, and the
# prompt step is set against oneDNN's f32 GEMMs (or against none), saying which and why.
avx2=(env KILN_CPU_ISA=avx2 ONEDNN_MAX_CPU_ISA=AVX2)
expect_exit 0 "build bf16 (avx2)" -- "${avx2[@]}" "$KILN" build --model "$FIXTURES/bloom-tiny" --precision bf16 -o "$TMP/bf16.plan" -q
expect_exit 0 "bench bf16 on avx2 --json" -- "${avx2[@]}" "$KILN" bench --plan "$TMP/bf16.plan" --input-len 12 --output-len 3 --runs 1 --warmup 0 --json
python3 - "$TMP/out" <<'PY' || fail "bench bf16 on avx2: results and which oneDNN GEMM"
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, lines
r = json.loads(lines[0])
assert r["precision"] == "bf16" and r["ttft_ms"] > 0 and r["roofline_pct"] > 0, r
assert r["onednn_dtype"] in ("bf16", "f32", None), r
if r["onednn_dtype"] != "bf16":
    # Not the plan's kind of GEMM: the row says so.
    assert "bf16" in r["onednn_note"], r
if r["onednn_dtype"] is None:
    assert r["prefill_vs_onednn_pct"] is None and r["onednn_linear_ms"] is None, r
else:
    assert r["onednn_linear_ms"] > 0 and r["prefill_vs_onednn_pct"] > 0, r
PY
expect_in "$TMP/err" "vs oneDNN" "bench bf16 on avx2 warns about the oneDNN comparison"
expect_exit 0 "bench bf16 on avx2 table" -- "${avx2[@]}" "$KILN" bench --plan "$TMP/bf16.plan" --input-len 8 --output-len 3 --runs 1 --warmup 0
expect_in "$TMP/out" "roofline" "bf16 on avx2: the table"
grep -qE '^vs oneDNN: .*(f32|no comparison)' "$TMP/out" || fail "bf16 on avx2: the table says which oneDNN GEMM: $(cat "$TMP/out")"

# --batch has no effect beside --sweep: a warning names both.
expect_exit 0 "bench --batch with --sweep" -- "$KILN" bench --plan "$TMP/b.plan" --input-len 8 --output-len 2 --runs 1 --warmup 0 --batch 2 --sweep batch=1,3 --json
expect_in "$TMP/err" "--batch 2 has no effect with --sweep" "--batch with --sweep warns"
python3 -c 'import json,sys; assert [json.loads(l)["batch"] for l in open(sys.argv[1])] == [1, 3]' "$TMP/out" || fail "--sweep's batch sizes run"
expect_exit 0 "bench --sweep alone" -- "$KILN" bench --plan "$TMP/b.plan" --input-len 8 --output-len 2 --runs 1 --warmup 0 --sweep batch=1 --json
grep -q -- "--batch" "$TMP/err" && fail "--sweep alone warns about --batch: $(cat "$TMP/err")"

expect_exit 2 "bad sweep" -- "$KILN" bench --plan "$TMP/b.plan" --sweep batch=1,x
expect_exit 2 "output-len 1" -- "$KILN" bench --plan "$TMP/b.plan" --output-len 1
expect_exit 2 "batch beyond the plan" -- "$KILN" bench --plan "$TMP/b.plan" --batch 100000
finish
