#!/usr/bin/env bash
# One command on the GPU machine: kiln (built here, carried in .device/) synthesizes real-size
# checkpoints, HuggingFace transformers loads them as is, and both generate the same greedy ids.
set -uo pipefail
export LD_LIBRARY_PATH="$PWD/.device/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
KILN="$PWD/.device/kiln"
OUT="${OUT:-/tmp/out}"
mkdir -p "$OUT"
{
  "$KILN" --version
  "$KILN" synth --preset flan-t5-small -o /tmp/synth/flan-t5-small
  "$KILN" synth --preset t5-small -o /tmp/synth/t5-small
  "$KILN" synth --preset bloom-560m -o /tmp/synth/bloom-560m
  python3 -c "import transformers, torch; print('transformers', transformers.__version__, 'torch', torch.__version__)"
  python3 scripts/device/synth_hf_parity.py "$KILN" /tmp/synth/flan-t5-small t5 /tmp/synth/t5-small t5 /tmp/synth/bloom-560m bloom
} 2>&1 | tee "$OUT/synth_hf_parity.log"
