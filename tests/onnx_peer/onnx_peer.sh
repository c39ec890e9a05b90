#!/usr/bin/env bash
# kiln exec against onnxruntime as a peer, on inputs of this test's own (peer.mjs: other batch
# sizes and lengths than the fixtures' stored case, left and right padding, one token, 40 tokens):
# onnxruntime-node (npm, installed from package-lock.json with --ignore-scripts: the package's
# prebuilt CPU library, no install script) computes the references; every output of kiln exec
# must be within 1e-4 of them relative to max |reference| at non-padded positions.
#   tests/onnx_peer/onnx_peer.sh KILN FIXTURES TMP
source "$(dirname "$0")/../cli/lib.bash"
HERE="$(cd "$(dirname "$0")" && pwd)"

if [ ! -d "$HERE/node_modules/onnxruntime-node" ]; then
  (cd "$HERE" && npm ci --ignore-scripts --no-audit --no-fund --loglevel=error) || { fail "npm ci in tests/onnx_peer"; finish; }
fi
rm -rf "$TMP/cases"
node "$HERE/peer.mjs" "$FIXTURES" "$TMP/cases" || { fail "onnxruntime-node references"; finish; }
cases=0
while read -r model name mask; do
  cases=$((cases + 1))
  m=()
  [ "$mask" != - ] && m=(--compare-mask "$mask")
  expect_exit 0 "$model $name" -- "$KILN" exec --onnx "$FIXTURES/onnx/$model.onnx" \
    --inputs "$TMP/cases/$model.$name.in.safetensors" \
    --compare "$TMP/cases/$model.$name.ref.safetensors" --atol 1e-3 --rtol 1e-3 "${m[@]}" --json || continue
  python3 - "$TMP/out" "$model.$name" <<'PY' || fail "$model $name: error against onnxruntime"
import json, sys
report = json.load(open(sys.argv[1]))
assert report["compare"]["pass"], report["compare"]
for o in report["compare"]["outputs"]:
    assert o["max_abs_error"] <= 1e-4 * o["max_abs_ref"], o
    print(f'{sys.argv[2]}.{o["name"]}: max abs error {o["max_abs_error"]:.3g} (max |ref| {o["max_abs_ref"]:.3g}), {o["compared"]} elements')
PY
done < "$TMP/cases/cases.txt"
[ "$cases" -eq 9 ] || fail "expected 9 cases from peer.mjs, got $cases"
finish
