#!/usr/bin/env bash
# `kiln exec --onnx`: the fixture exports (../shared/fixtures/onnx) run on the inputs stored in
# reference.safetensors; every output written by -o is within 1e-4 (relative to its max |value|)
# of onnxruntime's outputs at non-padded positions, checked here by reading the written file (not
# through --compare); --compare and --json report the same; a perturbed reference fails with
# exit 1; --help explains the command and the padded positions.
source "$(dirname "$0")/lib.bash"
ONNX="$FIXTURES/onnx"
REF="$ONNX/reference.safetensors"
HERE="$(cd "$(dirname "$0")" && pwd)"

for model in t5_encoder t5_decoder bloom; do
  mask=()
  [ "$model" != t5_decoder ] && mask=(--compare-mask attention_mask)
  expect_exit 0 "exec $model" -- "$KILN" exec --onnx "$ONNX/$model.onnx" --inputs "$REF" \
    --input-prefix "$model.in." -o "$TMP/$model.safetensors" --compare "$REF" \
    --compare-prefix "$model.out." --atol 1e-3 --rtol 1e-3 "${mask[@]}" --json || continue
  python3 - "$HERE" "$TMP/$model.safetensors" "$REF" "$model" "$TMP/out" <<'PY' || fail "$model: outputs"
import json, sys
sys.path.insert(0, sys.argv[1])
import onnx_st
got = onnx_st.read(sys.argv[2])
ref = onnx_st.read(sys.argv[3])
model = sys.argv[4]
report = json.load(open(sys.argv[5]))
inputs = onnx_st.select(ref, model + ".in.")
want = onnx_st.select(ref, model + ".out.")
assert set(got) == set(want), (sorted(got), sorted(want))
mask = inputs.get("attention_mask") if model != "t5_decoder" else None
for name, (dtype, shape, ref_values) in want.items():
    g_dtype, g_shape, values = got[name]
    assert (g_dtype, g_shape) == (dtype, shape), (name, g_dtype, g_shape, dtype, shape)
    per_position = len(values) // (shape[0] * shape[1])
    worst = scale = 0.0
    for i, (a, b) in enumerate(zip(values, ref_values)):
        if mask is not None and mask[2][i // per_position] == 0:
            continue
        worst = max(worst, abs(a - b))
        scale = max(scale, abs(b))
    assert scale > 0 and worst <= 1e-4 * scale, (name, worst, scale)
    print(f"{model}.{name}: max abs error {worst:.3g}, max |ref| {scale:.3g}")
    entry = [o for o in report["compare"]["outputs"] if o["name"] == name][0]
    assert entry["pass"] and entry["masked"] == (mask is not None), entry
    assert abs(entry["max_abs_error"] - worst) <= 1e-6 * scale, (entry, worst)
assert report["compare"]["pass"] is True
assert report["folded_nodes"] > 0 and report["executed_nodes"] > 0, report
assert [o["name"] for o in report["outputs"]] == list(want), report["outputs"]
PY
done

# Text report: per output errors and PASS, the outputs and what was written.
expect_exit 0 "exec bloom text" -- "$KILN" exec --onnx "$ONNX/bloom.onnx" --inputs "$REF" \
  --input-prefix bloom.in. -o "$TMP/bloom_text.safetensors" --compare "$REF" \
  --compare-prefix bloom.out. --atol 1e-3 --rtol 1e-3 --compare-mask attention_mask
expect_in "$TMP/out" "output logits" "names the output"
expect_in "$TMP/out" "float[2, 11, 96]" "gives its shape"
expect_in "$TMP/out" "wrote $TMP/bloom_text.safetensors (1 output)" "says what it wrote"
expect_in "$TMP/out" "max abs error" "reports the error"
expect_in "$TMP/out" "(masked): PASS" "compares the real positions"
expect_in "$TMP/out" "PASS: 1 of 1 outputs within tolerance" "summary"

# Inputs in a file of their own, by the graph's names; no -o: nothing written, exit 0.
python3 - "$HERE" "$REF" "$TMP/enc_in.safetensors" "$TMP/enc_ref_bad.safetensors" <<'PY' || fail "making input files"
import sys
sys.path.insert(0, sys.argv[1])
import onnx_st
ref = onnx_st.read(sys.argv[2])
onnx_st.write(sys.argv[3], onnx_st.select(ref, "t5_encoder.in."))
out = onnx_st.select(ref, "t5_encoder.out.")
dtype, shape, values = out["last_hidden_state"]
values = list(values)
values[5] += 1.0  # one real position (row 0) off by 1
onnx_st.write(sys.argv[4], {"last_hidden_state": (dtype, shape, values)})
PY
expect_exit 0 "exec without -o" -- "$KILN" exec --onnx "$ONNX/t5_encoder.onnx" --inputs "$TMP/enc_in.safetensors"
expect_in "$TMP/out" "output last_hidden_state" "lists the output"
# A reference one element away: exit 1, FAIL naming the count.
expect_exit 1 "perturbed reference" -- "$KILN" exec --onnx "$ONNX/t5_encoder.onnx" \
  --inputs "$TMP/enc_in.safetensors" --compare "$TMP/enc_ref_bad.safetensors" --atol 1e-3 --rtol 1e-3
expect_in "$TMP/out" "FAIL (1 outside tolerance)" "one element fails"
expect_in "$TMP/out" "FAIL: 0 of 1 outputs within tolerance" "summary says FAIL"
# A reference without the output: FAIL, exit 1.
expect_exit 1 "reference lacks the output" -- "$KILN" exec --onnx "$ONNX/t5_encoder.onnx" \
  --inputs "$TMP/enc_in.safetensors" --compare "$TMP/enc_in.safetensors"
expect_in "$TMP/out" "no reference tensor of this name" "says the reference lacks it"

expect_exit 0 "exec --help" -- "$KILN" exec --help
expect_in "$TMP/out" "padded positions (attention_mask 0) may differ from onnxruntime's" "--help: padding"
expect_in "$TMP/out" "Example" "--help: a worked example"
expect_in "$TMP/out" "--compare" "--help: --compare"
finish
