#!/usr/bin/env bash
# --version, --help of every subcommand, planned subcommands, usage errors.
source "$(dirname "$0")/lib.bash"

expect_exit 0 "--version" -- "$KILN" --version
expect_in "$TMP/out" "kiln 0." "--version"
expect_in "$TMP/out" "cpu:" "--version lists the cpu backend"
expect_in "$TMP/out" "cuda:" "--version says whether CUDA is compiled in"

for sub in build run eval bench perf inspect exec serve tokenize; do
  expect_exit 0 "$sub --help" -- "$KILN" "$sub" --help
  expect_in "$TMP/out" "$sub" "$sub --help"
done
expect_exit 1 "bench of a missing plan" -- "$KILN" bench --plan x.plan
expect_in "$TMP/err" "x.plan" "bench names the missing plan"
expect_exit 1 "serve of a missing plan" -- "$KILN" serve --plan x.plan
expect_in "$TMP/err" "x.plan" "serve names the missing plan"
expect_exit 2 "serve without a model" -- "$KILN" serve
expect_in "$TMP/err" "give exactly one of --model-repository DIR or --plan FILE" "serve says what it needs"

expect_exit 2 "no subcommand" -- "$KILN"
expect_exit 2 "unknown flag" -- "$KILN" run --no-such-flag
expect_exit 2 "unknown subcommand" -- "$KILN" frobnicate
expect_exit 2 "--onnx of a missing file" -- "$KILN" build --onnx m.onnx -o x.plan
expect_in "$TMP/err" "--onnx m.onnx: no such file" "--onnx names the file"
expect_exit 2 "--precision int8 without calibration" -- "$KILN" build --model "$FIXTURES/t5-tiny" --precision int8 -o "$TMP/x.plan"
expect_in "$TMP/err" "--calib FILE.jsonl" "--precision int8 says what to pass"

# --- issue 36, item 4: messages that fit the command; --help says what kiln is today ---
expect_exit 2 "inspect of two plans" -- "$KILN" inspect a.plan b.plan
expect_in "$TMP/err" "kiln inspect takes one plan ('a.plan' was given first)" "inspect a.plan b.plan says why"
if grep -q -- "--prompt" "$TMP/err"; then fail "inspect a.plan b.plan suggests a --prompt inspect has not"; fi
expect_exit 2 "help of two commands" -- "$KILN" help run build
expect_in "$TMP/err" "kiln help takes one command ('run' was given first)" "help run build says why"
if grep -q -- "--prompt" "$TMP/err"; then fail "help run build suggests a --prompt help has not"; fi
expect_exit 2 "tokenize with an unquoted --text" -- "$KILN" tokenize --plan x.plan --text a b
expect_in "$TMP/err" "quote a value that contains spaces (--text" "tokenize shows quoting with its own --text"
expect_exit 2 "run with an unquoted --prompt" -- "$KILN" run --plan x.plan --prompt a b
expect_in "$TMP/err" "quote a value that contains spaces (--prompt" "run shows quoting with --prompt"
expect_exit 0 "--help" -- "$KILN" --help
expect_in "$TMP/out" "compiles HuggingFace transformer checkpoints" "--help says what kiln does"
expect_in "$TMP/out" "serve it" "--help says kiln serves plans"
finish
