#!/usr/bin/env bash
# `kiln build --onnx`: the fixture exports (../shared/fixtures/onnx) lift into generation plans;
# `kiln exec --plan` on them gives onnxruntime's outputs (reference.safetensors) within 1e-4
# relative to max |value| at non-padded positions, checked here by reading the written file;
# `kiln run` generates from them; `kiln inspect --onnx` says what lifted.
source "$(dirname "$0")/lib.bash"
ONNX="$FIXTURES/onnx"
REF="$ONNX/reference.safetensors"
HERE="$(cd "$(dirname "$0")" && pwd)"

expect_exit 0 "build bloom" -- "$KILN" build --onnx "$ONNX/bloom.onnx" \
  --tokenizer "$FIXTURES/bloom-tiny/tokenizer.json" -o "$TMP/bloom.plan"
expect_in "$TMP/err" "lifted 20 ops (attentionx2 embeddingx1 gelux2 layer_normx6 linearx9)" "build log: lifts"
expect_in "$TMP/err" "BLOOM: 2 layers, hidden 32, 4 heads, vocab 96" "build log: the model"
expect_exit 0 "build t5" -- "$KILN" build --onnx "$ONNX/t5_encoder.onnx" --onnx "$ONNX/t5_decoder.onnx" \
  --tokenizer "$FIXTURES/t5-tiny/spiece.model" -o "$TMP/t5.plan"
expect_in "$TMP/err" "T5: 2+2 layers, d_model 32, 4 heads x 8" "build log: the T5 model"

# The T5 decoder runs first on the plan's own encoder states: its inputs are the encoder export's
# input_ids and attention_mask and the decoder export's input_ids as decoder_input_ids.
python3 - "$HERE" "$REF" "$TMP/t5_decoder_inputs.safetensors" <<'PY' || fail "t5 decoder inputs"
import sys
sys.path.insert(0, sys.argv[1])
import onnx_st
ref = onnx_st.read(sys.argv[2])
assert ref["t5_decoder.in.encoder_attention_mask"] == ref["t5_encoder.in.attention_mask"]
onnx_st.write(sys.argv[3], {"input_ids": ref["t5_encoder.in.input_ids"],
                            "attention_mask": ref["t5_encoder.in.attention_mask"],
                            "decoder_input_ids": ref["t5_decoder.in.input_ids"]})
PY

check() {  # check NAME PLAN GRAPH INPUTS PREFIX MASK
  local name="$1" plan="$2" graph="$3" inputs="$4" prefix="$5" mask="$6" compare_mask=()
  [ -n "$mask" ] && compare_mask=(--compare-mask attention_mask)
  expect_exit 0 "exec --plan $name" -- "$KILN" exec --plan "$plan" --graph "$graph" \
    --inputs "$inputs" --input-prefix "$prefix" -o "$TMP/$name.safetensors" --compare "$REF" \
    --compare-prefix "$name.out." --atol 1e-4 --rtol 1e-3 "${compare_mask[@]}" --json || return
  python3 - "$HERE" "$TMP/$name.safetensors" "$REF" "$name" "$TMP/out" "$mask" <<'PY' || fail "$name: outputs"
import json, sys
sys.path.insert(0, sys.argv[1])
import onnx_st
got, ref, model = onnx_st.read(sys.argv[2]), onnx_st.read(sys.argv[3]), sys.argv[4]
report = json.load(open(sys.argv[5]))
mask = ref[sys.argv[6]][2] if sys.argv[6] else None
want = onnx_st.select(ref, model + ".out.")
assert set(got) == set(want), (sorted(got), sorted(want))
for name, (dtype, shape, ref_values) in want.items():
    assert got[name][:2] == (dtype, shape), (name, got[name][:2], dtype, shape)
    per_position = len(ref_values) // (shape[0] * shape[1])
    worst = scale = 0.0
    for i, (a, b) in enumerate(zip(got[name][2], ref_values)):
        if mask is not None and mask[i // per_position] == 0:
            continue
        worst, scale = max(worst, abs(a - b)), max(scale, abs(b))
    assert scale > 0 and worst <= 1e-4 * scale, (name, worst, scale)
    print(f"plan {model}.{name}: max abs error {worst:.3g}, max |ref| {scale:.3g}")
assert report["compare"]["pass"] is True and report["sequences"] == 2, report
PY
}
check bloom "$TMP/bloom.plan" decoder "$REF" bloom.in. bloom.in.attention_mask
check t5_encoder "$TMP/t5.plan" encoder "$REF" t5_encoder.in. t5_encoder.in.attention_mask
check t5_decoder "$TMP/t5.plan" decoder "$TMP/t5_decoder_inputs.safetensors" "" ""
# And on the decoder export's own inputs: onnxruntime's encoder_hidden_states and
# encoder_attention_mask, the plan's encoder not run.
check t5_decoder "$TMP/t5.plan" decoder "$REF" t5_decoder.in. ""

# Generation from the plans (random models: only that ids come back).
expect_exit 0 "run bloom" -- "$KILN" run --plan "$TMP/bloom.plan" --prompt "12" --max-new-tokens 4 --json
expect_in "$TMP/out" '"output_ids":[' "run bloom --json"
expect_exit 0 "run t5" -- "$KILN" run --plan "$TMP/t5.plan" --prompt "reverse" --max-new-tokens 4 --beams 2 --json
expect_in "$TMP/out" '"output_ids":[' "run t5 --json"

# kiln bench of a plan whose tokenizer has more pieces than the export's vocabulary (the fixture
# exports' 96 ids with the fixture models' tokenizers): the prompt keeps to the model's ids.
expect_exit 0 "bench t5 from onnx" -- "$KILN" bench --plan "$TMP/t5.plan" --input-len 8 --output-len 4 --runs 1 --json
expect_in "$TMP/out" '"decode_ms_per_token":' "bench t5 --json"

expect_exit 0 "inspect bloom" -- "$KILN" inspect --onnx "$ONNX/bloom.onnx"
expect_in "$TMP/out" "attention 4 heads x 8 (fused qkv), scale 0.353553, causal, alibi at '/m/transformer/h.0/self_attention/Softmax'" "inspect: the attention"
expect_in "$TMP/out" "model: BLOOM: 2 layers" "inspect: the model"
expect_exit 0 "inspect t5 decoder" -- "$KILN" inspect --onnx "$ONNX/t5_decoder.onnx" --json
python3 - "$TMP/out" <<'PY' || fail "inspect --json: lifted"
import json, sys
r = json.load(open(sys.argv[1]))["lifted"]
kinds = [op["summary"] for op in r["ops"] if op["kind"] == "attention"]
assert len(kinds) == 4 and sum("t5 relative bias" in k for k in kinds) == 2, kinds
assert r["failures"] == [], r["failures"]
assert "T5 decoder" in r["model"]["note"], r["model"]
PY

# An int8 (W8A8) build from ONNX: calibration and the sensitivity fallback run on the lifted
# model. Prompts of single letters: the random export's 96 ids cover them, no merges.
printf '"%s"\n' hello abcdefg zxcvbn mnbvcx poiuyt lkjhgf asdfgh >"$TMP/calib.jsonl"
expect_exit 0 "build bloom int8 --calib" -- "$KILN" build --onnx "$ONNX/bloom.onnx" \
  --tokenizer "$FIXTURES/bloom-tiny/tokenizer.json" --precision int8 --calib "$TMP/calib.jsonl" \
  --calib-tokens 2 --calib-cache "$TMP/bloom.calib" -o "$TMP/bloom-int8.plan"
expect_in "$TMP/err" "sensitivity:" "int8 build log: the sensitivity fallback ran"
expect_exit 0 "cache-only rebuild" -- "$KILN" build --onnx "$ONNX/bloom.onnx" \
  --tokenizer "$FIXTURES/bloom-tiny/tokenizer.json" --precision int8 \
  --calib-cache "$TMP/bloom.calib" -o "$TMP/bloom-int8-cached.plan"
expect_exit 0 "run int8" -- "$KILN" run --plan "$TMP/bloom-int8.plan" --prompt "hello" --max-new-tokens 4 --json
cp "$TMP/out" "$TMP/int8.json"
expect_exit 0 "run cached int8" -- "$KILN" run --plan "$TMP/bloom-int8-cached.plan" --prompt "hello" --max-new-tokens 4 --json
cmp -s "$TMP/out" "$TMP/int8.json" || fail "the cache-only rebuild generates other ids"
finish
