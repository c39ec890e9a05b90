#!/usr/bin/env bash
# `kiln exec --onnx` with bad inputs (`make asan` runs this script): input names, dtypes and ranks
# that do not match the graph (exit 2 naming the input and what was expected), a graph that fails
# at run time (token ids past the vocabulary: exit 1 naming the node), and bad file arguments.
source "$(dirname "$0")/lib.bash"
ONNX="$FIXTURES/onnx"
REF="$ONNX/reference.safetensors"
HERE="$(cd "$(dirname "$0")" && pwd)"
BLOOM="$ONNX/bloom.onnx"

python3 - "$HERE" "$TMP" <<'PY' || fail "making input files"
import sys
sys.path.insert(0, sys.argv[1])
import onnx_st
d = sys.argv[2]
ids = ("I64", [1, 4], [5, 6, 7, 8])
mask = ("I64", [1, 4], [1, 1, 1, 1])
onnx_st.write(d + "/misnamed.safetensors", {"input_idz": ids, "attention_mask": mask})
onnx_st.write(d + "/missing.safetensors", {"input_ids": ids})
onnx_st.write(d + "/float_ids.safetensors", {"input_ids": ("F32", [1, 4], [5.0, 6.0, 7.0, 8.0]), "attention_mask": mask})
onnx_st.write(d + "/rank1.safetensors", {"input_ids": ("I64", [4], [5, 6, 7, 8]), "attention_mask": mask})
onnx_st.write(d + "/batch.safetensors", {"input_ids": ("I64", [2, 2], [5, 6, 7, 8]), "attention_mask": mask})
onnx_st.write(d + "/vocab.safetensors", {"input_ids": ("I64", [1, 4], [5, 6, 7, 1000]), "attention_mask": mask})
PY

expect_exit 2 "misnamed input" -- "$KILN" exec --onnx "$BLOOM" --inputs "$TMP/misnamed.safetensors"
expect_in "$TMP/err" "'input_idz' is not an input of the graph; its inputs are 'input_ids' (int64[batch, seq])" "names the input and the graph's"
expect_exit 2 "missing input" -- "$KILN" exec --onnx "$BLOOM" --inputs "$TMP/missing.safetensors"
expect_in "$TMP/err" "input 'attention_mask' (int64[batch, seq]) is missing" "names the missing input"
expect_exit 2 "float ids" -- "$KILN" exec --onnx "$BLOOM" --inputs "$TMP/float_ids.safetensors"
expect_in "$TMP/err" "input 'input_ids' is float[1, 4], expected int64[batch, seq]" "dtype"
expect_exit 2 "rank 1 ids" -- "$KILN" exec --onnx "$BLOOM" --inputs "$TMP/rank1.safetensors"
expect_in "$TMP/err" "input 'input_ids' is int64[4] (rank 1), expected int64[batch, seq] (rank 2)" "rank"
expect_exit 2 "batch mismatch" -- "$KILN" exec --onnx "$BLOOM" --inputs "$TMP/batch.safetensors"
expect_in "$TMP/err" "dimension 0 ('batch') is 1, but input 'input_ids' gave 'batch' = 2" "symbolic dims"
expect_exit 1 "token id past the vocabulary" -- "$KILN" exec --onnx "$BLOOM" --inputs "$TMP/vocab.safetensors"
expect_in "$TMP/err" "(Gather): Gather index 1000 is out of range for a dimension of 96" "names the failing node"
expect_in "$TMP/err" "$BLOOM: node '" "names the file and node"

# File arguments.
expect_exit 1 "missing --inputs" -- "$KILN" exec --onnx "$BLOOM" --inputs "$TMP/nope.safetensors"
expect_in "$TMP/err" "--inputs $TMP/nope.safetensors: no such file" "missing file"
printf 'garbage' > "$TMP/garbage.safetensors"
expect_exit 1 "corrupt --inputs" -- "$KILN" exec --onnx "$BLOOM" --inputs "$TMP/garbage.safetensors"
expect_in "$TMP/err" "$TMP/garbage.safetensors" "names the corrupt file"
printf 'not a protobuf \xff\xff\xff\xff' > "$TMP/garbage.onnx"
expect_exit 1 "corrupt --onnx" -- "$KILN" exec --onnx "$TMP/garbage.onnx" --inputs "$REF" --input-prefix bloom.in.
expect_in "$TMP/err" "$TMP/garbage.onnx: not an ONNX model" "names the corrupt model"
expect_exit 1 "directory --onnx" -- "$KILN" exec --onnx "$TMP" --inputs "$REF"
expect_in "$TMP/err" "is a directory" "directory"
expect_exit 2 "prefix matches nothing" -- "$KILN" exec --onnx "$BLOOM" --inputs "$REF" --input-prefix gpt.in.
expect_in "$TMP/err" "no tensor whose name starts with 'gpt.in.'" "says the prefix matches nothing"
expect_exit 2 "-o in a missing directory" -- "$KILN" exec --onnx "$BLOOM" --inputs "$REF" --input-prefix bloom.in. -o "$TMP/no/such/dir/out.safetensors"
expect_exit 2 "--compare-prefix without --compare" -- "$KILN" exec --onnx "$BLOOM" --inputs "$REF" --input-prefix bloom.in. --compare-prefix bloom.out.
expect_in "$TMP/err" "--compare-prefix needs --compare" "says what is missing"
expect_exit 2 "--compare-mask of no input" -- "$KILN" exec --onnx "$BLOOM" --inputs "$REF" --input-prefix bloom.in. --compare "$REF" --compare-prefix bloom.out. --compare-mask mask
expect_in "$TMP/err" "--compare-mask mask: no input of that name" "names the mask"
expect_exit 2 "negative --atol" -- "$KILN" exec --onnx "$BLOOM" --inputs "$REF" --atol -1
expect_exit 2 "no --inputs" -- "$KILN" exec --onnx "$BLOOM"
finish
