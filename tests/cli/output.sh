#!/usr/bin/env bash
# Where output goes (issue 7, items 4 and 21): a failed write to standard output is exit 1 with
# a message, a closed pipe ends quietly; progress shows on a terminal and never on a pipe; -v
# reports generation steps. Issue 36, item 1: a failed write to standard error (logs, progress,
# error messages) changes nothing: the work is done and the exit code is the same.
source "$(dirname "$0")/lib.bash"

expect_exit 0 "build t5" -- "$KILN" build --model "$FIXTURES/t5-tiny" -o "$TMP/t5.plan"
head -n 200 "$FIXTURES/data/dev.jsonl" > "$TMP/dev200.jsonl"

# --- item 4: > /dev/full is exit 1 naming standard output, for every subcommand that prints ---
[ -c /dev/full ] || fail "/dev/full is not a character device on this machine"
full_check() {  # full_check DESCRIPTION -- command...
  local what="$1"
  shift 2
  "$@" >/dev/full 2>"$TMP/err"
  local code=$?
  [ "$code" -eq 1 ] || fail "$what > /dev/full: exit $code, expected 1"
  expect_in "$TMP/err" "cannot write to standard output: No space left on device" "$what > /dev/full says so"
}
full_check "run" -- "$KILN" run --plan "$TMP/t5.plan" --prompt "reverse: abc"
full_check "run --json" -- "$KILN" run --plan "$TMP/t5.plan" --prompt "reverse: abc" --json
full_check "eval" -- "$KILN" eval --plan "$TMP/t5.plan" --dataset "$TMP/dev200.jsonl" --max-new-tokens 4
full_check "eval --json" -- "$KILN" eval --plan "$TMP/t5.plan" --dataset "$TMP/dev200.jsonl" --max-new-tokens 4 --json
full_check "tokenize" -- "$KILN" tokenize --plan "$TMP/t5.plan" --text hi
full_check "tokenize --decode" -- "$KILN" tokenize --plan "$TMP/t5.plan" --decode --text "6 17"
full_check "inspect" -- "$KILN" inspect "$TMP/t5.plan"
full_check "inspect --json" -- "$KILN" inspect "$TMP/t5.plan" --json
full_check "--version" -- "$KILN" --version
full_check "--help" -- "$KILN" --help
full_check "run --help" -- "$KILN" run --help
full_check "help run" -- "$KILN" help run

# A reader that goes away: the command ends quietly with exit 0. The output is larger than a pipe
# buffer, so writing must hit the closed pipe.
pipe_check() {  # pipe_check DESCRIPTION -- command...
  local what="$1"
  shift 2
  "$@" 2>"$TMP/err" | head -c 10 >/dev/null
  local code=${PIPESTATUS[0]}
  [ "$code" -eq 0 ] || fail "$what | head: exit $code, expected 0"
  [ ! -s "$TMP/err" ] || fail "$what | head: printed $(head -c 300 "$TMP/err")"
}
pipe_check "tokenize" -- "$KILN" tokenize --plan "$TMP/t5.plan" --input "$FIXTURES/t5-tiny/tokenizer_reference.jsonl" --json
pipe_check "run" -- "$KILN" run --plan "$TMP/t5.plan" --input "$FIXTURES/data/dev.jsonl" --json --max-new-tokens 2
pipe_check "inspect --graph" -- "$KILN" inspect "$TMP/t5.plan" --graph
"$KILN" run --plan "$TMP/t5.plan" --prompt "reverse: abc" --prompt "add: 1 + 2" 2>"$TMP/err" | head -n 1 > "$TMP/out"
[ "${PIPESTATUS[0]}" -eq 0 ] || fail "run | head -1: exit ${PIPESTATUS[0]}"
[ "$(wc -l < "$TMP/out")" -eq 1 ] || fail "run | head -1 printed $(wc -l < "$TMP/out") lines"

# --- issue 36, item 1: standard error that cannot be written is ignored ---
# Every check above sends standard error to a file; these make it the stream that fails.
# A reader of both streams that stops at the first match: the build goes on, writes its plan.
rm -f "$TMP/g.plan"
"$KILN" build --model "$FIXTURES/t5-tiny" -o "$TMP/g.plan" 2>&1 | grep -q loading
[ "${PIPESTATUS[0]}" -eq 0 ] || fail "build 2>&1 | grep -q loading: exit ${PIPESTATUS[0]}, expected 0"
expect_exit 0 "the plan of build 2>&1 | grep -q" -- "$KILN" inspect "$TMP/g.plan"
rm -f "$TMP/g.plan"
"$KILN" build --model "$FIXTURES/t5-tiny" -o "$TMP/g.plan" 2>/dev/full >"$TMP/out"
code=$?
[ "$code" -eq 0 ] || fail "build 2>/dev/full: exit $code, expected 0"
expect_exit 0 "the plan of build 2>/dev/full" -- "$KILN" run --plan "$TMP/g.plan" --prompt "reverse: abc"
# -v logs to standard error before the result: `2>&1 | head -1` takes a log line and goes away.
"$KILN" -v run --plan "$TMP/t5.plan" --prompt "reverse: abc" 2>&1 | head -n 1 > "$TMP/out"
[ "${PIPESTATUS[0]}" -eq 0 ] || fail "-v run 2>&1 | head -1: exit ${PIPESTATUS[0]}, expected 0"
expect_in "$TMP/out" "[kiln I" "-v run 2>&1 | head -1 shows the first log line"
# Results still go out (and their failure still counts) when only standard error is full.
"$KILN" -v run --plan "$TMP/t5.plan" --prompt "reverse: abc" 2>/dev/full >"$TMP/out"
code=$?
[ "$code" -eq 0 ] || fail "-v run 2>/dev/full: exit $code, expected 0"
[ -s "$TMP/out" ] || fail "-v run 2>/dev/full printed no result"
"$KILN" -v run --plan "$TMP/t5.plan" --prompt "reverse: abc" 2>/dev/full >/dev/full
code=$?
[ "$code" -eq 1 ] || fail "-v run >/dev/full 2>/dev/full: exit $code, expected 1"
# Errors keep their exit codes when they cannot be shown.
"$KILN" run --plan "$TMP/t5.plan" --prompt "" 2>/dev/full >/dev/null
code=$?
[ "$code" -eq 2 ] || fail "run --prompt '' 2>/dev/full: exit $code, expected 2"
"$KILN" run --plan "$TMP/missing.plan" --prompt hi 2>/dev/full >/dev/null
code=$?
[ "$code" -eq 1 ] || fail "run --plan MISSING 2>/dev/full: exit $code, expected 1"
"$KILN" run --plan "$TMP/t5.plan" --bogus 2>/dev/full >/dev/null
code=$?
[ "$code" -eq 2 ] || fail "run --bogus 2>/dev/full: exit $code, expected 2"
"$KILN" 2>/dev/full >/dev/null
code=$?
[ "$code" -eq 2 ] || fail "kiln (no command) 2>/dev/full: exit $code, expected 2"
"$KILN" serve 2>/dev/full >/dev/null
code=$?
[ "$code" -eq 2 ] || fail "serve (no model given) 2>/dev/full: exit $code, expected 2"

# --- item 21: progress on a terminal, nothing on a pipe; -v reports generation steps ---
expect_exit 0 "eval on a pipe" -- "$KILN" eval --plan "$TMP/t5.plan" --dataset "$FIXTURES/data/dev.jsonl"
[ ! -s "$TMP/err" ] || fail "eval on a pipe wrote to stderr: $(head -c 300 "$TMP/err")"
expect_exit 0 "run --input on a pipe" -- "$KILN" run --plan "$TMP/t5.plan" --input "$FIXTURES/data/dev.jsonl"
[ ! -s "$TMP/err" ] || fail "run --input on a pipe wrote to stderr: $(head -c 300 "$TMP/err")"
if ! command -v script >/dev/null; then
  fail "the terminal checks need script(1) (util-linux)"
else
  # script(1) gives the command a terminal; 600 rows take long enough for the line to be drawn.
  on_tty() { script -qec "$*" /dev/null > "$TMP/tty" 2>&1 < /dev/null; }
  on_tty "'$KILN' eval --plan '$TMP/t5.plan' --dataset '$FIXTURES/data/dev.jsonl'"
  expect_in "$TMP/tty" "/600 prompts" "eval shows rows done on a terminal"
  grep -qE 'accuracy [01]\.[0-9]{3}' "$TMP/tty" || fail "eval shows the running accuracy: $(head -c 300 "$TMP/tty")"
  grep -qE '[0-9]+/s' "$TMP/tty" || fail "eval's progress shows a rate: $(head -c 300 "$TMP/tty")"
  expect_in "$TMP/tty" "overall         0.997    600" "the table still prints after the progress line"
  on_tty "'$KILN' -q eval --plan '$TMP/t5.plan' --dataset '$FIXTURES/data/dev.jsonl'"
  if grep -q "prompts" "$TMP/tty"; then fail "-q still shows progress"; fi
  on_tty "'$KILN' run --plan '$TMP/t5.plan' --input '$FIXTURES/data/dev.jsonl' --max-new-tokens 8"
  expect_in "$TMP/tty" "/600 prompts" "run over a file shows progress on a terminal"
  [ "$(grep -c . "$TMP/tty")" -ge 600 ] || fail "run on a terminal: the results are all printed"
fi
expect_exit 0 "-v run" -- "$KILN" -v run --plan "$TMP/t5.plan" --prompt "reverse: abc" --prompt "add: 1 + 2" --max-new-tokens 5
grep -qE 'generating: 2 prompts, [0-9]+ decoding steps, [0-9]+ new tokens' "$TMP/err" ||
  fail "-v reports decoding steps: $(cat "$TMP/err")"
steps=$(sed -nE 's/.*generating: 2 prompts, ([0-9]+) decoding steps.*/\1/p' "$TMP/err")
[ "${steps:-0}" -gt 2 ] || fail "-v counts decoding steps ($steps), not prompts"
finish
