#!/usr/bin/env bash
# Ctrl-C (SIGINT) or SIGTERM while kiln writes a file (synth's 1 GB flan-t5-base checkpoint)
# removes the temporary PATH.partial.PID and ends with the signal; the target never appears.
# synth writes its files into DIR.partial.PID: the whole directory goes (issue 36, item 2), and
# SIGKILL, which nothing can catch, leaves that directory, never a partial DIR.
source "$(dirname "$0")/lib.bash"
# Job control: without it bash starts background commands with SIGINT ignored.
set -m

for sig in INT TERM KILL; do
  out="$TMP/synth-$sig"
  rm -rf "$out" "$out".*
  "$KILN" -q synth --preset flan-t5-base -o "$out" >"$TMP/out" 2>"$TMP/err" &
  pid=$!
  # Wait until the weights file is being written (at most 60 s), then interrupt.
  for _ in $(seq 600); do
    compgen -G "$out.partial.$pid/model.safetensors.partial.*" >/dev/null && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  compgen -G "$out.partial.$pid/model.safetensors.partial.*" >/dev/null \
    || fail "SIG$sig: synth never started writing $out.partial.$pid/model.safetensors"
  kill -"$sig" "$pid"
  wait "$pid"
  code=$?
  expected=$((128 + $(kill -l "$sig")))
  [ "$code" -eq "$expected" ] || fail "SIG$sig: exit $code, expected $expected"
  [ ! -e "$out" ] || fail "SIG$sig: $out appeared ($(ls "$out" | tr '\n' ' '))"
  leftovers=$(compgen -G "$out.*" || true)
  if [ "$sig" = KILL ]; then
    [ "$leftovers" = "$out.partial.$pid" ] || fail "SIGKILL: expected $out.partial.$pid left, found '$leftovers'"
    rm -rf "$out.partial.$pid"
  else
    [ -z "$leftovers" ] || fail "SIG$sig left $leftovers behind"
  fi
done
finish
