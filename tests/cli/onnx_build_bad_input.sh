#!/usr/bin/env bash
# `kiln build --onnx` and `kiln exec --plan` with bad arguments: each a clear error with the
# usage (2) or runtime (1) exit code, never a crash.
source "$(dirname "$0")/lib.bash"
ONNX="$FIXTURES/onnx"
REF="$ONNX/reference.safetensors"
HERE="$(cd "$(dirname "$0")" && pwd)"
TOK="$FIXTURES/bloom-tiny/tokenizer.json"

expect_exit 2 "no tokenizer" -- "$KILN" build --onnx "$ONNX/bloom.onnx" -o "$TMP/x.plan"
expect_in "$TMP/err" "ONNX files carry no tokenizer" "names --tokenizer"
expect_exit 2 "--model and --onnx" -- "$KILN" build --model "$FIXTURES/bloom-tiny" --onnx "$ONNX/bloom.onnx" -o "$TMP/x.plan"
expect_in "$TMP/err" "give either --model HF_DIR or --onnx FILE" "one source"
expect_exit 2 "three files" -- "$KILN" build --onnx a --onnx b --onnx c --tokenizer "$TOK" -o "$TMP/x.plan"
expect_exit 2 "missing file" -- "$KILN" build --onnx "$TMP/nothing.onnx" --tokenizer "$TOK" -o "$TMP/x.plan"
expect_in "$TMP/err" "no such file" "names the file"
expect_exit 2 "a T5 encoder alone" -- "$KILN" build --onnx "$ONNX/t5_encoder.onnx" --tokenizer "$TOK" -o "$TMP/x.plan"
expect_in "$TMP/err" "this is a T5 encoder export; a T5 plan is built from the encoder and the decoder exports together" "says what else it needs"
[ -e "$TMP/x.plan" ] && fail "a failed build left $TMP/x.plan"
expect_exit 2 "-o is an input" -- "$KILN" build --onnx "$ONNX/bloom.onnx" --tokenizer "$TOK" -o "$ONNX/bloom.onnx"

expect_exit 0 "build" -- "$KILN" build --onnx "$ONNX/bloom.onnx" --tokenizer "$TOK" -o "$TMP/bloom.plan"
python3 - "$HERE" "$TMP" <<'PY' || fail "making input files"
import sys
sys.path.insert(0, sys.argv[1])
import onnx_st
d = sys.argv[2]
ids = ("I64", [1, 4], [5, 6, 7, 8])
onnx_st.write(d + "/misnamed.safetensors", {"input_idz": ids})
onnx_st.write(d + "/vocab.safetensors", {"input_ids": ("I64", [1, 4], [5, 6, 7, 1000])})
onnx_st.write(d + "/rank1.safetensors", {"input_ids": ("I64", [4], [5, 6, 7, 8])})
onnx_st.write(d + "/empty_row.safetensors", {"input_ids": ids, "attention_mask": ("I64", [1, 4], [0, 0, 0, 0])})
PY
expect_exit 2 "misnamed input" -- "$KILN" exec --plan "$TMP/bloom.plan" --inputs "$TMP/misnamed.safetensors"
expect_in "$TMP/err" "'input_idz' is not an input of the plan's decoder graph (inputs: input_ids, attention_mask)" "names the inputs"
expect_exit 2 "id past the vocabulary" -- "$KILN" exec --plan "$TMP/bloom.plan" --inputs "$TMP/vocab.safetensors"
expect_in "$TMP/err" "input_ids holds id 1000, outside [0, 96)" "names the id"
expect_exit 2 "rank 1" -- "$KILN" exec --plan "$TMP/bloom.plan" --inputs "$TMP/rank1.safetensors"
expect_exit 2 "all padding" -- "$KILN" exec --plan "$TMP/bloom.plan" --inputs "$TMP/empty_row.safetensors"
expect_exit 2 "encoder of a decoder-only plan" -- "$KILN" exec --plan "$TMP/bloom.plan" --graph encoder --inputs "$REF" --input-prefix bloom.in.
expect_in "$TMP/err" "--graph encoder: the plan's graphs are decoder" "names the graphs"
expect_exit 2 "--plan and --onnx" -- "$KILN" exec --plan "$TMP/bloom.plan" --onnx "$ONNX/bloom.onnx" --inputs "$REF"
expect_exit 2 "--graph without --plan" -- "$KILN" exec --onnx "$ONNX/bloom.onnx" --graph encoder --inputs "$REF" --input-prefix bloom.in.

# The T5 decoder on given encoder states (the decoder export's inputs).
expect_exit 0 "build t5" -- "$KILN" build --onnx "$ONNX/t5_encoder.onnx" --onnx "$ONNX/t5_decoder.onnx" \
  --tokenizer "$FIXTURES/t5-tiny/spiece.model" -o "$TMP/t5.plan"
python3 - "$HERE" "$TMP" <<'PY' || fail "making T5 input files"
import sys
sys.path.insert(0, sys.argv[1])
import onnx_st
d = sys.argv[2]
ids = ("I64", [1, 2], [0, 5])
states = ("F32", [1, 3, 32], [0.5] * 96)
onnx_st.write(d + "/narrow.safetensors", {"input_ids": ids, "encoder_hidden_states": ("F32", [1, 3, 16], [0.5] * 48)})
onnx_st.write(d + "/flat.safetensors", {"input_ids": ids, "encoder_hidden_states": ("F32", [3, 32], [0.5] * 96)})
onnx_st.write(d + "/int_states.safetensors", {"input_ids": ids, "encoder_hidden_states": ("I64", [1, 3, 32], [1] * 96)})
onnx_st.write(d + "/mask_shape.safetensors", {"input_ids": ids, "encoder_hidden_states": states, "encoder_attention_mask": ("I64", [1, 4], [1] * 4)})
onnx_st.write(d + "/mask_zeros.safetensors", {"input_ids": ids, "encoder_hidden_states": states, "encoder_attention_mask": ("I64", [1, 3], [0] * 3)})
onnx_st.write(d + "/rows.safetensors", {"input_ids": ("I64", [2, 2], [0, 5, 0, 6]), "encoder_hidden_states": states})
onnx_st.write(d + "/mixed.safetensors", {"input_ids": ids, "encoder_hidden_states": states, "decoder_input_ids": ids})
PY
expect_exit 2 "states of another width" -- "$KILN" exec --plan "$TMP/t5.plan" --inputs "$TMP/narrow.safetensors"
expect_in "$TMP/err" "encoder states are [3, 16], the plan's encoder writes [tokens, 32]" "names the widths"
expect_exit 2 "states without a batch" -- "$KILN" exec --plan "$TMP/t5.plan" --inputs "$TMP/flat.safetensors"
expect_in "$TMP/err" "expected a float [batch, sequence, d_model] tensor" "names the shape"
expect_exit 2 "integer states" -- "$KILN" exec --plan "$TMP/t5.plan" --inputs "$TMP/int_states.safetensors"
expect_exit 2 "mask of another length" -- "$KILN" exec --plan "$TMP/t5.plan" --inputs "$TMP/mask_shape.safetensors"
expect_in "$TMP/err" "encoder_attention_mask is [1, 4], encoder_hidden_states [1, 3, 32]" "names both shapes"
expect_exit 2 "all-padding states" -- "$KILN" exec --plan "$TMP/t5.plan" --inputs "$TMP/mask_zeros.safetensors"
expect_in "$TMP/err" "row 0 of encoder_attention_mask is all zeros" "names the row"
expect_exit 2 "rows differ" -- "$KILN" exec --plan "$TMP/t5.plan" --inputs "$TMP/rows.safetensors"
expect_exit 2 "two input forms mixed" -- "$KILN" exec --plan "$TMP/t5.plan" --inputs "$TMP/mixed.safetensors"
expect_in "$TMP/err" "'decoder_input_ids' is not an input of the plan's decoder (given encoder states) graph (inputs: input_ids, encoder_hidden_states, encoder_attention_mask)" "names the input set"
finish
