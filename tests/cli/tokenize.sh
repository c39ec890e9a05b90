#!/usr/bin/env bash
# kiln tokenize: ids identical to the HF reference rows; --input, --json and --decode.
source "$(dirname "$0")/lib.bash"

for model in t5-tiny bloom-tiny; do
  ref="$FIXTURES/$model/tokenizer_reference.jsonl"
  head -n 40 "$ref" > "$TMP/$model.jsonl"
  expect_exit 0 "$model tokenize --input" -- "$KILN" tokenize --model "$FIXTURES/$model" --input "$TMP/$model.jsonl" --json
  python3 - "$TMP/$model.jsonl" "$TMP/out" <<'PY' || fail "$model: ids differ from the reference"
import json, sys
ref = [json.loads(l) for l in open(sys.argv[1])]
got = [json.loads(l) for l in open(sys.argv[2])]
assert len(ref) == len(got), (len(ref), len(got))
for r, g in zip(ref, got):
    assert r["text"] == g["text"] and r["ids"] == g["ids"], (r, g)
PY
done

expect_exit 0 "plain --text" -- "$KILN" tokenize --model "$FIXTURES/t5-tiny" --text "reverse: suvogi"
expect_in "$TMP/out" "6 17 8 3 31 156 41 157 73 1" "t5 ids of 'reverse: suvogi'"
expect_exit 0 "--decode" -- "$KILN" tokenize --model "$FIXTURES/bloom-tiny" --decode --text "[291, 403, 89, 82, 74, 76, 260]"
expect_in "$TMP/out" "reverse: suvogi =" "bloom decode"
printf '"plain string"\n{"text": "object with text"}\n\n' > "$TMP/mixed.jsonl"
expect_exit 0 "strings and objects" -- "$KILN" tokenize --model "$FIXTURES/bloom-tiny" --input "$TMP/mixed.jsonl" --json
[ "$(wc -l < "$TMP/out")" -eq 2 ] || fail "two input rows give two output rows"

# Bad input: clear errors, exit codes as DESIGN.md says.
expect_exit 1 "missing model dir" -- "$KILN" tokenize --model "$TMP/nope" --text hi
expect_in "$TMP/err" "$TMP/nope" "error names the directory"
printf '{"txt": 3}\n' > "$TMP/bad.jsonl"
expect_exit 2 "bad input row" -- "$KILN" tokenize --model "$FIXTURES/t5-tiny" --input "$TMP/bad.jsonl"
expect_in "$TMP/err" "bad.jsonl:1" "error names file:line"
expect_exit 2 "decode of non-ids" -- "$KILN" tokenize --model "$FIXTURES/t5-tiny" --decode --text "hello"
finish
