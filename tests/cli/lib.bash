# Shared helpers for CLI tests: each test script gets KILN (binary), FIXTURES and TMP.
set -uo pipefail
KILN="$1"
FIXTURES="$2"
TMP="$3/cli_$(basename "$0" .sh)"
mkdir -p "$TMP"
failures=0

fail() {
  echo "FAIL: $*" >&2
  failures=$((failures + 1))
}

# expect_exit CODE DESCRIPTION -- command...: runs the command, checks its exit code, keeps
# stdout in $TMP/out and stderr in $TMP/err.
expect_exit() {
  local code="$1" what="$2"
  shift 3
  "$@" >"$TMP/out" 2>"$TMP/err"
  local got=$?
  if [ "$got" -ne "$code" ]; then
    fail "$what: exit $got, expected $code (stderr: $(head -c 400 "$TMP/err"))"
    return 1
  fi
  return 0
}

expect_in() {  # expect_in FILE TEXT DESCRIPTION
  grep -qF -- "$2" "$1" || fail "$3: '$2' not in $(basename "$1"): $(head -c 400 "$1")"
}

finish() {
  if [ "$failures" -ne 0 ]; then
    echo "$failures check(s) failed" >&2
    exit 1
  fi
  echo "all checks passed"
}
