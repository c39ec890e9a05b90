#!/bin/bash
# On the GPU machine (from the folder scripts/device/pack.sh filled): decode speed of a
# bloom-560m-shaped fp16 plan with HF's logits processors off and on, same plan and prompts, at
# batch 1 and 16, 3 rounds each, 128 new tokens (min = max, so no run stops early).
#   off:    --min-new-tokens only (an EOS ban inside the argmax; run-ahead on)
#   off-ra: the same with run-ahead off (KILN_RUN_AHEAD=0): what a step costs without it
#   on:     + --repetition-penalty 1.2 --no-repeat-ngram-size 3 (one edit kernel a step, the
#           edits uploaded each step; run-ahead off, as the edits need the last tokens)
# Prints kiln's own "generating: ..." line (tokens/s) for each.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}
source "$HERE/bundle_env.sh"
M=/tmp/bloom-560m
[ -d "$M" ] || "$KILN" -q synth --preset bloom-560m --dtype fp16 -o "$M" --seed 1
[ -f /tmp/b560.plan ] || "$KILN" -q build --model "$M" --device cuda --precision fp16 -o /tmp/b560.plan
for batch in 1 16; do
  prompts=()
  for i in $(seq 1 "$batch"); do prompts+=(--prompt "the quick brown fox number $i jumps over"); done
  for round in 1 2 3; do
    for variant in off off-ra on; do
      flags=(--max-new-tokens 128 --min-new-tokens 128 --batch-size "$batch")
      env=()
      [ "$variant" = off-ra ] && env=(KILN_RUN_AHEAD=0)
      [ "$variant" = on ] && flags+=(--repetition-penalty 1.2 --no-repeat-ngram-size 3)
      line=$(env "${env[@]}" "$KILN" -v run --plan /tmp/b560.plan "${prompts[@]}" "${flags[@]}" 2>&1 >/dev/null |
        grep -o 'generating: .*')
      echo "batch $batch round $round $variant: $line"
    done
  done
done
