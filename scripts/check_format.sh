#!/usr/bin/env bash
# Fails when a C++ file differs from what clang-format (with the checked-in .clang-format) makes of it.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v clang-format >/dev/null; then
  echo "clang-format not found: run scripts/deps.sh" >&2
  exit 1
fi
mapfile -t files < <(git ls-files --cached --others --exclude-standard -- '*.h' '*.cc' '*.cu' '*.cuh' |
  while read -r f; do [ -f "$f" ] && echo "$f"; done)
# One clang-format process for all files (one per file took most of a minute); it names each
# place that differs as "FILE:LINE:COL: error: code should be clang-formatted".
out=$(clang-format --style=file --dry-run --Werror "${files[@]}" 2>&1) && exit 0
grep -oE '^[^:]+:[0-9]+:[0-9]+: error: code should be clang-formatted' <<<"$out" | cut -d: -f1 |
  sort -u | sed 's/$/ (run: make format)/; s/^/needs formatting: /' >&2
grep -qE 'error: code should be clang-formatted' <<<"$out" || echo "$out" >&2
exit 1
