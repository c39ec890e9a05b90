#!/bin/bash
# Where a decode step's time goes inside its CUDA graph, by Nsight Systems: each kernel's real
# start and end in the replayed graph (--cuda-graph-trace=node), where ncu (profile.sh) times
# every kernel alone, without the overlap programmatic dependent launch gives. The real-size
# models synthesized and built with --no-tune (as decode_ab.sh does), a short `kiln bench` run
# under nsys, summarized by timeline_summary.py (per kernel kind of a steady decode step: its
# duration and the gap from the kernel before it). Nsight Systems' importer needs libdw, which
# the GPU machine lacks: pack.sh ships it in x/toollib.
# Usage: timeline.sh [--batches "1"] [--models "bloom-560m flan-t5-large"] [--prefill]
#                    [VAR=value ...]
# (the variables are set for the bench run; --prefill: the summary of the prompt step and the
# first decode steps after it instead of the steady decode step; --between: what the GPU runs
# between two decode steps' graphs). Logs in $OUT/timeline.log, the traces' CSV beside it.
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}
BATCHES="1"
MODELS="bloom-560m flan-t5-large"
MODE=
while [ $# -gt 0 ]; do
  case "$1" in
    --batches) BATCHES=$2; shift ;;
    --models) MODELS=$2; shift ;;
    --prefill) MODE=--prefill ;;
    --between) MODE=--between ;;
    *) break ;;
  esac
  shift
done
mkdir -p "$OUT"
source "$HERE/bundle_env.sh"
source "$HERE/untuned_plan.sh"
LOG="$OUT/timeline.log"
date -u >>"$LOG"
NSYS=$(command -v nsys || find / -name nsys -type f -perm -u+x -not -path '/proc/*' 2>/dev/null | head -1)
[ -n "$NSYS" ] || { echo "nsys not found" | tee -a "$LOG"; exit 1; }
TOOLS_LD="$LD_LIBRARY_PATH:$HERE/x/toollib"
for model in $MODELS; do
  untuned_plan "$model" || continue
  for b in $BATCHES; do
    rep=/tmp/timeline-$model-b$b
    echo "== nsys $model $prec batch $b $*" | tee -a "$LOG"
    env "$@" LD_LIBRARY_PATH="$TOOLS_LD" "$NSYS" profile --cuda-graph-trace=node --trace=cuda \
      -o "$rep" --force-overwrite true "$KILN" bench --plan "$plan" --input-len 78 \
      --output-len 24 --runs 1 --warmup 1 --batch "$b" >>"$LOG" 2>&1
    # An nsys whose importer did not run leaves the raw .qdstrm: import it with one found here.
    if [ ! -f "$rep.nsys-rep" ] && [ -f "$rep.qdstrm" ]; then
      for importer in $(find / -name QdstrmImporter -type f -not -path '/proc/*' 2>/dev/null); do
        LD_LIBRARY_PATH="$TOOLS_LD" "$importer" -i "$rep.qdstrm" >>"$LOG" 2>&1 && break
      done
    fi
    LD_LIBRARY_PATH="$TOOLS_LD" "$NSYS" stats --report cuda_gpu_trace --format csv \
      --force-export true -o "$rep" "$rep.nsys-rep" >>"$LOG" 2>&1
    cp "${rep}_cuda_gpu_trace.csv" "$OUT/" 2>/dev/null
    python3 "$HERE/timeline_summary.py" "${rep}_cuda_gpu_trace.csv" $MODE 2>&1 | tee -a "$LOG"
  done
done
