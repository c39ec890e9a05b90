#!/usr/bin/env bash
# Bad input through the CLI: a clear message and the right exit code, never a crash.
source "$(dirname "$0")/lib.bash"

expect_exit 1 "missing model" -- "$KILN" run --model "$TMP/missing" --prompt hi
expect_in "$TMP/err" "$TMP/missing" "names the directory"
expect_exit 1 "missing plan" -- "$KILN" run --plan "$TMP/missing.plan" --prompt hi
printf 'garbage' > "$TMP/garbage.plan"
expect_exit 1 "corrupt plan" -- "$KILN" run --plan "$TMP/garbage.plan" --prompt hi
expect_in "$TMP/err" "not a kiln plan" "corrupt plan message"

mkdir -p "$TMP/llama"
printf '{"model_type": "llama", "hidden_size": 8}' > "$TMP/llama/config.json"
expect_exit 1 "unknown architecture" -- "$KILN" build --model "$TMP/llama" -o "$TMP/llama.plan"
expect_in "$TMP/err" "llama" "names the model_type"

mkdir -p "$TMP/trunc"
cp "$FIXTURES/t5-tiny/config.json" "$FIXTURES/t5-tiny/spiece.model" "$TMP/trunc/"
head -c 100000 "$FIXTURES/t5-tiny/model.safetensors" > "$TMP/trunc/model.safetensors"
expect_exit 1 "truncated safetensors" -- "$KILN" build --model "$TMP/trunc" -o "$TMP/trunc.plan"
expect_in "$TMP/err" "model.safetensors" "names the file"

expect_exit 0 "build small profile" -- "$KILN" build --model "$FIXTURES/t5-tiny" --max-input-tokens 8 -o "$TMP/short.plan"
expect_exit 2 "prompt beyond the plan's max" -- "$KILN" run --plan "$TMP/short.plan" --prompt "copy: puboka puboka puboka puboka"
expect_in "$TMP/err" "at most 8" "says the limit"
expect_exit 2 "max-new-tokens 0" -- "$KILN" run --plan "$TMP/short.plan" --prompt "copy: de" --max-new-tokens 0
expect_exit 2 "negative max-new-tokens" -- "$KILN" run --plan "$TMP/short.plan" --prompt "copy: de" --max-new-tokens -1
expect_exit 2 "too many beams" -- "$KILN" run --plan "$TMP/short.plan" --prompt "copy: de" --beams 1000
expect_in "$TMP/err" "beams" "names the flag"
expect_exit 2 "unknown early-stopping" -- "$KILN" run --plan "$TMP/short.plan" --prompt "copy: de" --beams 2 --early-stopping sometimes
expect_in "$TMP/err" "early-stopping" "names the flag"
expect_exit 2 "empty prompt" -- "$KILN" run --plan "$TMP/short.plan" --prompt ""
expect_exit 2 "bad template" -- "$KILN" run --plan "$TMP/short.plan" --prompt "x" --prompt-template "no placeholder"
printf 'not json\n' > "$TMP/bad.jsonl"
expect_exit 2 "malformed input file" -- "$KILN" run --plan "$TMP/short.plan" --input "$TMP/bad.jsonl"
expect_in "$TMP/err" "bad.jsonl:1" "names file:line"
printf '{"task": "x"}\n' > "$TMP/bad_ds.jsonl"
expect_exit 2 "malformed dataset" -- "$KILN" eval --plan "$TMP/short.plan" --dataset "$TMP/bad_ds.jsonl"
finish
