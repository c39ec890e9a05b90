#!/usr/bin/env bash
# `kiln inspect --onnx`: the fixture exports' inputs, outputs and opset (README: TorchScript
# exporter, opset 17, dynamic batch/sequence axes; reference.safetensors: the input and output
# names), --json, and bad files (exit 1 naming the file; `make asan` runs this script).
source "$(dirname "$0")/lib.bash"
ONNX="$FIXTURES/onnx"

expect_exit 0 "inspect bloom.onnx" -- "$KILN" inspect --onnx "$ONNX/bloom.onnx"
expect_in "$TMP/out" "opset 17" "text: opset"
expect_in "$TMP/out" "input_ids" "text: an input"
expect_in "$TMP/out" "attention_mask" "text: an input"
expect_in "$TMP/out" "logits" "text: the output"
expect_in "$TMP/out" "unsupported ops: none" "text: every op imported"
expect_in "$TMP/out" "folded at build time (declared input shapes): " "text: what folds"

for model in bloom t5_encoder t5_decoder; do
  expect_exit 0 "inspect --json $model" -- "$KILN" inspect --onnx "$ONNX/$model.onnx" --json || continue
  python3 - "$TMP/out" "$ONNX/reference.safetensors" "$model" <<'PY' || fail "$model: --json report"
import json, struct, sys
report = json.load(open(sys.argv[1]))
raw = open(sys.argv[2], "rb").read()
header = json.loads(raw[8:8 + struct.unpack("<Q", raw[:8])[0]])
model = sys.argv[3]
def names(kind):
    prefix = f"{model}.{kind}."
    return {k[len(prefix):]: v for k, v in header.items() if k.startswith(prefix)}
dtypes = {"I64": "int64", "F32": "float"}
for kind, key in (("in", "inputs"), ("out", "outputs")):
    want = names(kind)
    got = {v["name"]: v for v in report[key]}
    assert set(got) == set(want), (key, sorted(got), sorted(want))
    for name, ref in want.items():
        assert got[name]["dtype"] == dtypes[ref["dtype"]], (name, got[name])
        shape = got[name]["shape"]
        assert len(shape) == len(ref["shape"]), (name, shape)
        # dynamic batch and sequence axes: symbolic names, not numbers
        assert all(isinstance(d, str) for d in shape[:2]), (name, shape)
assert report["opset"] == 17, report["opset"]
assert report["producer"]["name"] == "pytorch", report["producer"]
assert report["unsupported_ops"] == [], report["unsupported_ops"]
assert report["initializers"]["count"] > 0 and report["initializers"]["bytes"] > 0
assert sum(report["ops"].values()) == report["nodes"]
# Folding with the declared shapes (batch and sequence symbolic): every Constant folds, every
# Shape of an input stays (its dims are not numbers); folded and remaining nodes are all nodes.
folded = report["folded"]
assert folded["ops"].get("Constant") == report["ops"]["Constant"], folded
assert "Shape" not in folded["ops"], folded
assert folded["nodes"] + folded["remaining_nodes"] == report["nodes"], folded
assert folded["nodes"] == sum(folded["ops"].values()), folded
PY
done

# Bad files: exit 1, naming the file.
expect_exit 1 "missing --onnx" -- "$KILN" inspect --onnx "$TMP/missing.onnx"
expect_in "$TMP/err" "--onnx $TMP/missing.onnx: no such file" "names flag and file"
printf 'not a protobuf \xff\xff\xff\xff' > "$TMP/garbage.onnx"
expect_exit 1 "corrupt --onnx" -- "$KILN" inspect --onnx "$TMP/garbage.onnx"
expect_in "$TMP/err" "$TMP/garbage.onnx: not an ONNX model" "corrupt file message"
head -c 90000 "$ONNX/bloom.onnx" > "$TMP/truncated.onnx"
expect_exit 1 "truncated --onnx" -- "$KILN" inspect --onnx "$TMP/truncated.onnx"
expect_in "$TMP/err" "$TMP/truncated.onnx" "names the truncated file"
expect_exit 1 "directory --onnx" -- "$KILN" inspect --onnx "$TMP"
expect_in "$TMP/err" "is a directory" "says it is a directory"
expect_exit 2 "--onnx with a plan" -- "$KILN" inspect --onnx "$ONNX/bloom.onnx" --plan x.plan
expect_exit 2 "--onnx with --graph" -- "$KILN" inspect --onnx "$ONNX/bloom.onnx" --graph
finish
