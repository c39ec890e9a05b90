# Sourced by decode_ab.sh, binary_ab.sh, profile.sh, tactics_ab.sh and timeline.sh (needs $KILN
# and $LOG). `untuned_plan MODEL`
# synthesizes MODEL's real-size checkpoint into /tmp/synth (once per machine: bloom-* in fp16,
# the rest in fp32) and builds a CUDA plan of it with --no-tune (no tactic timing: quick) into
# /tmp/plans, fp16 for BLOOM and bf16 for T5 (AB_PRECISION=P builds precision P instead, e.g.
# int8-weight), logging both to $LOG. Sets `prec` and `plan`; returns non-zero (and says so) when
# the build fails.
untuned_plan() {
  local model=$1 sdtype dir
  case "$model" in
    bloom-*) sdtype=fp16 prec=fp16 ;;
    *) sdtype=fp32 prec=bf16 ;;
  esac
  prec=${AB_PRECISION:-$prec}
  mkdir -p /tmp/synth /tmp/plans
  dir=/tmp/synth/$model plan=/tmp/plans/$model-$prec-ab.plan
  [ -d "$dir" ] || "$KILN" synth --preset "$model" --dtype "$sdtype" -o "$dir" >>"$LOG" 2>&1
  [ -f "$plan" ] || "$KILN" build --model "$dir" --device cuda --precision "$prec" \
    --max-input-tokens 128 --max-step-tokens 8192 --no-tune -o "$plan" >>"$LOG" 2>&1 ||
    { echo "build $model failed" | tee -a "$LOG"; return 1; }
}
