#!/usr/bin/env bash
# How options take values, help and conventions (issue 7, items 1, 2, 7, 17-20).
source "$(dirname "$0")/lib.bash"

expect_exit 0 "build t5" -- "$KILN" build --model "$FIXTURES/t5-tiny" -o "$TMP/t5.plan"
expect_exit 0 "build bloom" -- "$KILN" build --model "$FIXTURES/bloom-tiny" --prompt-template "{prompt} =" -o "$TMP/bloom.plan"

# json_field FILE FIELD: one line per output row, the field's value as JSON.
json_field() {
  python3 -c 'import json, sys
for line in open(sys.argv[1]):
    print(json.dumps(json.loads(line)[sys.argv[2]]))' "$1" "$2"
}

# --- item 1: a value is the exact string given, one per occurrence, however it looks ---
for prompt in "[3, 1, 2]" "[x]" "[]" "a,b" "a, b" "-x" "--json"; do
  expect_exit 0 "--prompt '$prompt'" -- "$KILN" run --plan "$TMP/t5.plan" --prompt "$prompt" --json --max-new-tokens 2
  [ "$(wc -l < "$TMP/out")" -eq 1 ] || fail "--prompt '$prompt' ran $(wc -l < "$TMP/out") prompts, expected 1"
  [ "$(json_field "$TMP/out" prompt)" = "$(python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$prompt")" ] ||
    fail "--prompt '$prompt' became $(json_field "$TMP/out" prompt)"
done
expect_exit 0 "--prompt '[]' then --json" -- "$KILN" run --plan "$TMP/t5.plan" --prompt "[]" --json --max-new-tokens 2
python3 -c 'import json,sys; json.loads(open(sys.argv[1]).readline())' "$TMP/out" || fail "--json after --prompt '[]' was not taken as a flag"
expect_exit 0 "two prompts that look like lists" -- "$KILN" run --plan "$TMP/t5.plan" --prompt "[3, 1, 2]" --prompt "[a]" --json --max-new-tokens 2
[ "$(json_field "$TMP/out" prompt | tr '\n' '|')" = '"[3, 1, 2]"|"[a]"|' ] || fail "two list-like prompts: $(cat "$TMP/out")"
expect_exit 2 "unquoted prompt with a space" -- "$KILN" run --plan "$TMP/t5.plan" --prompt reverse: abc
expect_in "$TMP/err" "unexpected argument 'abc'" "names the stray word"
expect_in "$TMP/err" "each option takes exactly one value" "explains"
[ ! -s "$TMP/out" ] || fail "an unquoted prompt still ran"
expect_exit 0 "tokenize --text '[a, b]'" -- "$KILN" tokenize --plan "$TMP/bloom.plan" --text "[a, b]" --json
[ "$(wc -l < "$TMP/out")" -eq 1 ] || fail "tokenize --text '[a, b]' tokenized $(wc -l < "$TMP/out") texts"
[ "$(json_field "$TMP/out" text)" = '"[a, b]"' ] || fail "tokenize --text '[a, b]' became $(json_field "$TMP/out" text)"

# --- item 2: with --decode, each --text is one id sequence and one output line ---
expect_exit 0 "decode two --text" -- "$KILN" tokenize --plan "$TMP/t5.plan" --decode --text "6 17 8" --text "159 154 55"
[ "$(wc -l < "$TMP/out")" -eq 2 ] || fail "two --decode --text gave $(wc -l < "$TMP/out") lines: $(cat "$TMP/out")"
expect_exit 0 "decode each alone" -- "$KILN" tokenize --plan "$TMP/t5.plan" --decode --text "6 17 8"
first=$(cat "$TMP/out")
expect_exit 0 "decode each alone" -- "$KILN" tokenize --plan "$TMP/t5.plan" --decode --text "159 154 55"
second=$(cat "$TMP/out")
expect_exit 0 "decode two --text, JSON lists" -- "$KILN" tokenize --plan "$TMP/t5.plan" --decode --text "[6, 17, 8]" --text "[159, 154, 55]"
[ "$(cat "$TMP/out")" = "$(printf '%s\n%s' "$first" "$second")" ] || fail "decode of two texts differs from each alone: $(cat "$TMP/out")"

# --- item 7: every {prompt} of a template is replaced ---
expect_exit 0 "template with {prompt} twice" -- "$KILN" run --plan "$TMP/bloom.plan" --prompt "ab" --prompt-template "{prompt} {prompt} =" --json --max-new-tokens 1
got_ids=$(json_field "$TMP/out" input_ids)
expect_exit 0 "tokenize the expanded template" -- "$KILN" tokenize --plan "$TMP/bloom.plan" --text "ab ab =" --json
[ "$got_ids" = "$(json_field "$TMP/out" ids)" ] || fail "'{prompt} {prompt} =' gave ids $got_ids, expected those of 'ab ab ='"
expect_exit 0 "build with {prompt} twice" -- "$KILN" build --model "$FIXTURES/bloom-tiny" --prompt-template "{prompt} {prompt} =" -o "$TMP/twice.plan"
expect_exit 0 "run the plan's template" -- "$KILN" run --plan "$TMP/twice.plan" --prompt "ab" --json --max-new-tokens 1
[ "$got_ids" = "$(json_field "$TMP/out" input_ids)" ] || fail "plan template '{prompt} {prompt} =' gave other ids"

# --- item 17: kiln help COMMAND; unknown commands list the commands ---
for sub in build run eval bench inspect exec serve tokenize; do
  expect_exit 0 "kiln help $sub" -- "$KILN" help "$sub"
  cp "$TMP/out" "$TMP/help_cmd"
  expect_exit 0 "kiln $sub --help" -- "$KILN" "$sub" --help
  cmp -s "$TMP/out" "$TMP/help_cmd" || fail "kiln help $sub differs from kiln $sub --help"
done
expect_exit 0 "kiln help" -- "$KILN" help
expect_in "$TMP/out" "tokenize" "kiln help lists the commands"
for cmd in frobnicate "help frobnicate"; do
  # shellcheck disable=SC2086
  expect_exit 2 "kiln $cmd" -- "$KILN" $cmd
  expect_in "$TMP/err" "unknown command 'frobnicate'" "says unknown command"
  expect_in "$TMP/err" "build, calibrate, run, eval, bench, perf, inspect, exec, serve, tokenize" "lists the commands"
done
expect_exit 2 "kiln rnu" -- "$KILN" rnu --plan x
expect_in "$TMP/err" "did you mean run?" "suggests the closest command"

# --- item 18: every subcommand's help lists the global flags and every value limit ---
for sub in build run eval inspect exec tokenize bench serve; do
  "$KILN" "$sub" --help > "$TMP/help" 2>&1
  for flag in "-v, --verbose" "-q, --quiet" "--threads N"; do expect_in "$TMP/help" "$flag" "$sub --help lists $flag"; done
  expect_in "$TMP/help" "1..$(nproc --all 2>/dev/null || nproc)" "$sub --help gives the --threads range"
  expect_in "$TMP/help" "Exit codes" "$sub --help gives the exit codes"
done
for sub in run eval; do
  "$KILN" "$sub" --help > "$TMP/help"
  for limit in "--max-new-tokens INT:in 1..8192" "--beams INT:in 1..32" "--batch-size INT:in 1..1024" \
    "--top-k INT:>= 0" "--top-p FLOAT:a number in (0, 1]" "--temperature FLOAT:a number in 0..100" "--seed INT:>= 0"; do
    expect_in "$TMP/help" "$limit" "$sub --help shows $limit"
  done
done
"$KILN" build --help > "$TMP/help"
expect_in "$TMP/help" "--max-input-tokens INT:in 1..65536" "build --help shows the --max-input-tokens range"

# --- item 19: inspect --plan and --json; --input - reads standard input ---
expect_exit 0 "inspect PLAN" -- "$KILN" inspect "$TMP/t5.plan"
cp "$TMP/out" "$TMP/inspect_positional"
expect_exit 0 "inspect --plan PLAN" -- "$KILN" inspect --plan "$TMP/t5.plan"
sed '/created_unix/d' "$TMP/out" > "$TMP/a"
sed '/created_unix/d' "$TMP/inspect_positional" > "$TMP/b"
cmp -s "$TMP/a" "$TMP/b" || fail "inspect --plan differs from inspect PLAN"
expect_exit 2 "inspect PLAN --plan PLAN" -- "$KILN" inspect "$TMP/t5.plan" --plan "$TMP/t5.plan"
expect_exit 0 "inspect --json" -- "$KILN" inspect --plan "$TMP/t5.plan" --json
python3 - "$TMP/out" <<'PY' || fail "inspect --json"
import json, sys
lines = open(sys.argv[1]).read().splitlines()
assert len(lines) == 1, "one JSON object on one line"
r = json.loads(lines[0])
assert r["architecture"] == "t5" and r["metadata"]["device"] == "cpu", r.keys()
names = [g["name"] for g in r["graphs"]]
assert names == ["encoder", "decoder"], names
for g in r["graphs"]:
    assert g["layers"]["Linear"] > 0 and g["weight_bytes"]["f32"] > 0
    assert [w["bindings"]["tokens"] for w in g["workspace"]] == [16, 64, 256, 512], g["workspace"]
    assert all(0 < w["bytes"] < w["unplanned_bytes"] for w in g["workspace"])
PY
expect_exit 0 "inspect --model --json" -- "$KILN" inspect --model "$FIXTURES/bloom-tiny" --json
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["source"]["model"] and r["graphs"][0]["fusions"]["linear_activation"] == 6, r["graphs"][0]["fusions"]' "$TMP/out" || fail "inspect --model --json"
printf '"reverse: suvogi"\n{"prompt": "add: 456 + 95"}\n' > "$TMP/prompts.jsonl"
expect_exit 0 "run --input FILE" -- "$KILN" run --plan "$TMP/t5.plan" --input "$TMP/prompts.jsonl"
cp "$TMP/out" "$TMP/from_file"
"$KILN" run --plan "$TMP/t5.plan" --input - < "$TMP/prompts.jsonl" > "$TMP/out" 2> "$TMP/err" || fail "run --input -: $(cat "$TMP/err")"
cmp -s "$TMP/out" "$TMP/from_file" || fail "run --input - differs from --input FILE: $(cat "$TMP/out")"
[ "$(cat "$TMP/out")" = "$(printf 'igovus\n551')" ] || fail "run --input - output: $(cat "$TMP/out")"
printf '{"task": "reverse", "prompt": "reverse: suvogi", "answer": "igovus"}\n' | "$KILN" eval --plan "$TMP/t5.plan" --dataset - --json > "$TMP/out" 2> "$TMP/err" || fail "eval --dataset -: $(cat "$TMP/err")"
expect_in "$TMP/out" '"overall":1.0' "eval --dataset - scores the row"
printf '[6, 17, 8]\n"x"\n' | "$KILN" tokenize --plan "$TMP/t5.plan" --decode --input - > "$TMP/out" 2> "$TMP/err"
expect_in "$TMP/err" "<stdin>:2" "errors in standard input name <stdin>:line"

# --- item 20: combinations that would be ignored warn ---
expect_exit 0 "--top-k without sampling" -- "$KILN" run --plan "$TMP/t5.plan" --prompt "reverse: abc" --top-k 5 --top-p 0.5 --seed 3
for flag in --top-k --top-p --seed; do expect_in "$TMP/err" "$flag has no effect without sampling" "$flag warns"; done
expect_exit 0 "--top-k with sampling" -- "$KILN" run --plan "$TMP/t5.plan" --prompt "reverse: abc" --top-k 5 --temperature 0.7 --seed 3
[ ! -s "$TMP/err" ] || fail "sampling flags with sampling warned: $(cat "$TMP/err")"
expect_exit 0 "--length-penalty without beams" -- "$KILN" run --plan "$TMP/t5.plan" --prompt "reverse: abc" --length-penalty 2
expect_in "$TMP/err" "--length-penalty has no effect without beam search" "warns"
expect_exit 0 "-v with -q" -- "$KILN" -v -q run --plan "$TMP/t5.plan" --prompt "reverse: abc"
expect_in "$TMP/err" "-v and -q were both given: -v wins" "warns"
printf '{"task": "reverse", "prompt": "reverse: suvogi", "answer": "igovus"}\n' > "$TMP/one.jsonl"
expect_exit 0 "eval --model BLOOM without a template" -- "$KILN" eval --model "$FIXTURES/bloom-tiny" --dataset "$TMP/one.jsonl"
expect_in "$TMP/err" '--prompt-template "{prompt} ="' "suggests the template"
expect_exit 0 "eval --model BLOOM with a template" -- "$KILN" eval --model "$FIXTURES/bloom-tiny" --dataset "$TMP/one.jsonl" --prompt-template "{prompt} ="
[ ! -s "$TMP/err" ] || fail "eval --model BLOOM with a template warned: $(cat "$TMP/err")"
expect_exit 0 "eval --model T5" -- "$KILN" eval --model "$FIXTURES/t5-tiny" --dataset "$TMP/one.jsonl"
[ ! -s "$TMP/err" ] || fail "eval --model T5 (encoder-decoder) warned: $(cat "$TMP/err")"
finish
