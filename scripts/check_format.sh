#!/usr/bin/env bash
# Fails when a C++ file differs from what clang-format (with the checked-in .clang-format) makes of it.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null; then
  echo "clang-format not found: run scripts/deps.sh" >&2
  exit 1
fi
files=$(git ls-files --cached --others --exclude-standard -- '*.h' '*.cc' '*.cu' '*.cuh')
bad=0
for f in $files; do
  [ -f "$f" ] || continue
  if ! clang-format --style=file --dry-run --Werror "$f" >/dev/null 2>&1; then
    echo "needs formatting: $f (run: make format)" >&2
    bad=1
  fi
done
exit $bad
