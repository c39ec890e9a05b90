#!/usr/bin/env bash
# The runtime-only program (public API, runtime library only) generates exactly what `kiln run`
# does from the same plan, and refuses a missing plan with an error.
set -u
RUNTIME_ONLY=$1 KILN=$2 PLAN=$3
expected=$("$KILN" run --plan "$PLAN" --prompt "add: 12 + 30" --prompt "reverse: suvogi") || exit 1
got=$("$RUNTIME_ONLY" "$PLAN" "add: 12 + 30" "reverse: suvogi") || { echo "runtime-only failed"; exit 1; }
[ "$got" = "$expected" ] || { echo "runtime-only: '$got' != kiln run: '$expected'"; exit 1; }
[ -n "$got" ] || { echo "empty output"; exit 1; }
if "$RUNTIME_ONLY" /nonexistent.plan "x" 2>/dev/null; then echo "missing plan accepted"; exit 1; fi
echo "ok"
