#!/usr/bin/env bash
# `make demo`: compiles the two bundled models into plans, runs a few prompts through each plan,
# and shows what `kiln inspect` says about one of them.
#
#   scripts/demo.sh [PATH/TO/kiln]        (default: build/kiln)
#
# Plans go to build/demo/ (override with KILN_DEMO_DIR). Works from any directory. Exits 1 when
# a model answers a prompt differently from HuggingFace (the expected answers below are the
# greedy outputs HF transformers produced for these prompts, from the fixtures' reference.json).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
kiln="${1:-build/kiln}"
# A relative path means relative to where we were called from, else to the repository root.
if [[ "$kiln" != /* ]]; then
  if [[ -e "$PWD/$kiln" ]]; then kiln="$PWD/$kiln"; else kiln="$root/$kiln"; fi
fi
if [[ ! -x "$kiln" ]]; then
  echo "demo: no kiln binary at $kiln (build it first: make build)" >&2
  exit 1
fi
cd "$root"
out="${KILN_DEMO_DIR:-build/demo}"
mkdir -p "$out"

if [[ -t 1 ]]; then bold=$'\e[1m'; plain=$'\e[0m'; else bold=""; plain=""; fi
heading() { printf '\n%s== %s ==%s\n' "$bold" "$1" "$plain"; }
indent() { sed '/./s/^/    /'; }
trim() {
  local s="$1"
  s="${s#"${s%%[![:space:]]*}"}"
  printf '%s' "${s%"${s##*[![:space:]]}"}"
}

prompts=("reverse: suvogi" "add: 456 + 95" "sort: f r t d e" "upper: tu" "count: fo va wa"
         "copy: de")
expected=("igovus" "551" "d e f r t" "TU" "3" "de")

heading "kiln"
"$kiln" --version | indent

heading "1. build: HuggingFace checkpoint -> plan"
t5_plan="$out/t5-tiny.plan"
bloom_plan="$out/bloom-tiny.plan"
echo "\$ kiln build --model models/t5-tiny -o $t5_plan"
"$kiln" build --model models/t5-tiny -o "$t5_plan" 2>&1 | indent
echo
# The BLOOM fixture was trained on "PROMPT =" and answers after the " =": the template is stored
# in the plan as its default.
echo "\$ kiln build --model models/bloom-tiny --prompt-template \"{prompt} =\" -o $bloom_plan"
"$kiln" build --model models/bloom-tiny --prompt-template "{prompt} =" -o "$bloom_plan" 2>&1 |
  indent
for plan in "$t5_plan" "$bloom_plan"; do
  awk -v f="$plan" -v b="$(stat -c %s "$plan")" 'BEGIN { printf "    %-28s %6.1f MiB\n", f, b / 1048576 }'
done

heading "2. run: greedy generation from each plan"
run_args=()
for p in "${prompts[@]}"; do run_args+=(--prompt "$p"); done
echo "\$ kiln run --plan PLAN --prompt \"reverse: suvogi\" --prompt \"add: 456 + 95\" ..."
mapfile -t t5_out < <("$kiln" run --plan "$t5_plan" "${run_args[@]}")
mapfile -t bloom_out < <("$kiln" run --plan "$bloom_plan" "${run_args[@]}")
if [[ ${#t5_out[@]} -ne ${#prompts[@]} || ${#bloom_out[@]} -ne ${#prompts[@]} ]]; then
  echo "demo: expected ${#prompts[@]} answers per plan, got ${#t5_out[@]} (t5) and" \
    "${#bloom_out[@]} (bloom)" >&2
  exit 1
fi
echo
row='    %-17s %-11s %-16s %s\n'
# shellcheck disable=SC2059
printf "$row" "prompt" "expected" "t5-tiny" "bloom-tiny"
# shellcheck disable=SC2059
printf "$row" "------" "--------" "-------" "----------"
misses=0
for i in "${!prompts[@]}"; do
  t5="$(trim "${t5_out[$i]}")"
  bloom="$(trim "${bloom_out[$i]}")"
  mark_t5="ok" mark_bloom="ok"
  if [[ "$t5" != "${expected[$i]}" ]]; then mark_t5="MISS"; misses=$((misses + 1)); fi
  if [[ "$bloom" != "${expected[$i]}" ]]; then mark_bloom="MISS"; misses=$((misses + 1)); fi
  # shellcheck disable=SC2059
  printf "$row" "${prompts[$i]}" "${expected[$i]}" "$t5 ($mark_t5)" "$bloom ($mark_bloom)"
done

heading "3. run --json: one request, beam search with 4 beams"
echo "\$ kiln run --plan $t5_plan --prompt \"reverse: suvogi\" --beams 4 --json"
"$kiln" run --plan "$t5_plan" --prompt "reverse: suvogi" --beams 4 --json | indent
echo "\$ kiln run --plan $bloom_plan --prompt \"add: 456 + 95\" --beams 4 --json"
"$kiln" run --plan "$bloom_plan" --prompt "add: 456 + 95" --beams 4 --json | indent

heading "4. inspect: what the T5 plan holds"
echo "\$ kiln inspect $t5_plan"
inspect="$out/t5-tiny.inspect.txt"
"$kiln" inspect "$t5_plan" >"$inspect"
# The build metadata (first lines), then the per-graph summary.
head -n 12 "$inspect" | indent
echo "    ... (config, source file hashes, tokenizer; full output in $inspect)"
awk '/^architecture:/ { on = 1 } on' "$inspect" | indent

heading "done"
if [[ $misses -ne 0 ]]; then
  echo "$misses answer(s) differ from HuggingFace's" >&2
  exit 1
fi
echo "every answer matches HuggingFace's greedy output; plans are in $out/"
