#!/bin/bash
# A served GPU's timeline: `kiln serve` under Nsight Systems (CUDA API and kernels, graph nodes
# traced one by one) while `kiln perf` drives 64 streaming clients (28-word prompts, 100 output
# tokens, EOS ignored, as ab.sh), summarized by serve_timeline.py: the GPU's busy share, its idle
# gaps and what the host did in them, graph launches by size, eager kernels. nsys traces DUR_S
# seconds after DELAY_S seconds of load, then ends the server (SIGTERM: it drains).
# Run from the folder scripts/device/pack.sh filled, after ab.sh built the plan of PRESET/PREC.
# Log: $OUT/profile-PRESET.log. Usage: profile_serve.sh PRESET PREC DELAY_S DUR_S
#   "LABEL [NAME=VALUE ...]" ...
set -u
HERE=$(cd "$(dirname "$0")" && pwd)
OUT=${OUT:-/tmp/out}
preset=$1 prec=$2 delay=$3 dur=$4
shift 4
source "$HERE/bundle_env.sh"
LOG="$OUT/profile-$preset.log"
plan=/tmp/plans/$preset-$prec-serve.plan
[ -f "$plan" ] || { echo "no plan $plan (run ab.sh first)" | tee -a "$LOG"; exit 1; }
NSYS=$(command -v nsys || find / -name nsys -type f -perm -u+x -not -path '/proc/*' 2>/dev/null | head -1)
[ -n "$NSYS" ] || { echo "nsys not found" | tee -a "$LOG"; exit 1; }
export NSYS KILN_REAL=$KILN NSYS_TOOLS_LD="$LD_LIBRARY_PATH:$HERE/x/toollib"
wrapper=/tmp/nsys_kiln.sh
cat >"$wrapper" <<'EOF'
#!/bin/bash
export LD_LIBRARY_PATH="$NSYS_TOOLS_LD"
exec "$NSYS" profile --trace=cuda --cuda-graph-trace=node --sample=none --cpuctxsw=none \
  --delay "$NSYS_DELAY" --duration "$NSYS_DURATION" -o "$NSYS_REP" --force-overwrite true \
  "$KILN_REAL" "$@"
EOF
chmod +x "$wrapper"
for variant in "$@"; do
  read -r -a words <<<"$variant"
  label=${words[0]}
  rep=/tmp/serve-profile-$preset-$label
  start_server "prof-$label" "$plan" BIN="$wrapper" NSYS_DELAY="$delay" NSYS_DURATION="$dur" \
    NSYS_REP="$rep" "${words[@]:1}" || { echo "serve $label failed" | tee -a "$LOG"; continue; }
  echo "== $preset $variant: nsys over ${dur} s after ${delay} s" | tee -a "$LOG"
  "$KILN" perf --url "$SERVER_URL" --model m --prompt-len 28 --output-len 100 --ignore-eos \
    --stream --concurrency 64 --duration $((delay + dur + 1)) --warmup 0 2>&1 |
    grep -E "concurrency|output tokens|error" | tee -a "$LOG"
  for _ in $(seq 1 120); do kill -0 "$SERVER_PID" 2>/dev/null || break; sleep 1; done
  kill -0 "$SERVER_PID" 2>/dev/null && stop_server
  LD_LIBRARY_PATH="$NSYS_TOOLS_LD" "$NSYS" stats --report cuda_gpu_trace --report cuda_api_trace \
    --format csv --force-export true -o "$rep" "$rep.nsys-rep" >>"$LOG" 2>&1
  python3 "$HERE/serve_timeline.py" "${rep}_cuda_gpu_trace.csv" "${rep}_cuda_api_trace.csv" 2>&1 |
    tee -a "$LOG"
done
