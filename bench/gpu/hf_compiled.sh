#!/bin/bash
# On the GPU machine (from the folder scripts/device/pack.sh filled): kiln against HuggingFace
# transformers eager and compiled (hf_baseline.py with HF_COMPILE=1) on the same `kiln synth`
# checkpoints, in one run: bloom-560m fp16 and flan-t5-large bf16, prompts of 78 tokens, 100 new
# tokens, batch 1 and 16, 3 runs each (medians). One JSON line per engine, model and batch.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}
source "$HERE/bundle_env.sh"
PY=python3
[ -x /opt/torch/.venv/bin/python3 ] && PY=/opt/torch/.venv/bin/python3
mkdir -p /tmp/synth /tmp/plans
for spec in "bloom-560m bloom fp16 fp16" "flan-t5-large t5 bf16 bf16"; do
  set -- $spec
  preset=$1 family=$2 sdtype=$3 prec=$4 dir=/tmp/synth/$1
  [ -d "$dir" ] || "$KILN" -q synth --preset "$preset" --dtype "$sdtype" -o "$dir" --seed 1
  "$KILN" -q build --model "$dir" --device cuda --precision "$prec" -o "/tmp/plans/$preset.plan"
  "$KILN" bench --plan "/tmp/plans/$preset.plan" --input-len 78 --output-len 100 --runs 3 \
    --sweep batch=1,16 --json 2>/dev/null
  timeout 200 $PY "$HERE/hf_baseline.py" "$dir" "$family" "$prec" 78 100 3 1 16 2>/dev/null
  HF_COMPILE=1 timeout 400 $PY "$HERE/hf_baseline.py" "$dir" "$family" "$prec" 78 100 3 1 16 2>"$OUT/hf_compile_$preset.err" |
    grep -v '^$'
done
