#!/usr/bin/env bash
# The Makefile (issue 36, items 4 and 5): `make` alone names the two commands and what they do;
# `make demo` builds only the kiln binary (not the tests and micro-benchmarks, minutes on a small
# machine), while `make test` still builds everything. Checked with `make -n` (nothing is run).
source "$(dirname "$0")/lib.bash"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
command -v make >/dev/null || { fail "make is not installed"; finish; }

make -s -C "$ROOT" >"$TMP/out" 2>"$TMP/err" || fail "make (no target): exit $? ($(cat "$TMP/err"))"
expect_in "$TMP/out" "make demo   builds" "make alone describes make demo"
expect_in "$TMP/out" "make test   builds" "make alone describes make test"
[ "$(wc -l < "$TMP/out")" -eq 2 ] || fail "make alone printed $(wc -l < "$TMP/out") lines, expected 2"

make -n -C "$ROOT" demo >"$TMP/out" 2>"$TMP/err" || fail "make -n demo: exit $? ($(cat "$TMP/err"))"
grep "cmake --build" "$TMP/out" >"$TMP/builds" || fail "make demo builds nothing: $(cat "$TMP/out")"
while read -r line; do
  [[ "$line" == *"--target kiln" ]] || fail "make demo builds more than kiln: $line"
done <"$TMP/builds"
expect_in "$TMP/out" "scripts/demo.sh" "make demo runs the demo"

make -n -C "$ROOT" test >"$TMP/out" 2>"$TMP/err" || fail "make -n test: exit $? ($(cat "$TMP/err"))"
grep "cmake --build" "$TMP/out" | head -n 1 >"$TMP/builds"
if grep -q -- "--target" "$TMP/builds"; then fail "make test no longer builds every target: $(cat "$TMP/builds")"; fi
expect_in "$TMP/out" "ctest" "make test runs ctest"
finish
