#!/usr/bin/env bash
# kiln synth: real-size HF-layout checkpoints with the public shapes, deterministic per seed,
# loadable by kiln (and HF) as is; bad presets and outputs are refused. Issue 36, item 2: an
# existing checkpoint is never overwritten without --force, and a checkpoint appears whole or not
# at all (concurrent runs, failures; interrupts are in interrupt.sh).
source "$(dirname "$0")/lib.bash"

expect_exit 0 "list" -- "$KILN" synth --list
for p in flan-t5-small flan-t5-base flan-t5-large flan-t5-xl t5-small bloom-560m bloom-1b1 bloom-3b; do
  expect_in "$TMP/out" "$p" "--list shows $p"
done

expect_exit 0 "synth flan-t5-small bf16" -- "$KILN" synth --preset flan-t5-small --dtype bf16 -o "$TMP/fts" --seed 3
for f in config.json generation_config.json model.safetensors spiece.model tokenizer_config.json; do
  [ -s "$TMP/fts/$f" ] || fail "synth wrote no $f"
done
python3 - "$TMP/fts" <<'PY' || fail "flan-t5-small layout"
import json, struct, sys
d = sys.argv[1]
c = json.load(open(d + "/config.json"))
assert (c["d_model"], c["d_ff"], c["d_kv"], c["num_heads"], c["num_layers"], c["num_decoder_layers"], c["vocab_size"]) == (512, 1024, 64, 6, 8, 8, 32128), c
assert c["feed_forward_proj"] == "gated-gelu" and c["tie_word_embeddings"] is False
f = open(d + "/model.safetensors", "rb")
h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
h.pop("__metadata__", None)
assert all(t["dtype"] == "BF16" for t in h.values())
assert h["shared.weight"]["shape"] == [32128, 512] and h["lm_head.weight"]["shape"] == [32128, 512]
assert h["encoder.block.0.layer.0.SelfAttention.relative_attention_bias.weight"]["shape"] == [32, 6]
assert h["decoder.block.7.layer.2.DenseReluDense.wi_1.weight"]["shape"] == [1024, 512]
assert "encoder.block.1.layer.0.SelfAttention.relative_attention_bias.weight" not in h
n = 1
total = sum(__import__("math").prod(t["shape"]) for t in h.values())
assert 76_000_000 < total < 78_000_000, total
PY
expect_exit 0 "run the synthesized model" -- "$KILN" run --model "$TMP/fts" --prompt "reverse: suvogi" --max-new-tokens 4 --json
python3 -c "import json,sys; r=json.load(open(sys.argv[1])); assert len(r['output_ids']) == 4, r" "$TMP/out" || fail "4 tokens from the synthesized model"

# Same seed, same bytes; another seed, other bytes.
expect_exit 0 "synth t5-small seed 3" -- "$KILN" synth --preset t5-small -o "$TMP/a" --seed 3
expect_exit 0 "synth t5-small seed 3 again" -- "$KILN" synth --preset t5-small -o "$TMP/b" --seed 3 -q
expect_exit 0 "synth t5-small seed 4" -- "$KILN" synth --preset t5-small -o "$TMP/c" --seed 4 -q
cmp -s "$TMP/a/model.safetensors" "$TMP/b/model.safetensors" || fail "same seed gave different weights"
cmp -s "$TMP/a/model.safetensors" "$TMP/c/model.safetensors" && fail "different seeds gave the same weights"
python3 - "$TMP/a" <<'PY' || fail "t5-small layout (relu, tied)"
import json, struct, sys
c = json.load(open(sys.argv[1] + "/config.json"))
assert c["feed_forward_proj"] == "relu" and c["tie_word_embeddings"] is True and c["num_heads"] == 8
f = open(sys.argv[1] + "/model.safetensors", "rb")
h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
assert "lm_head.weight" not in h and "encoder.block.5.layer.1.DenseReluDense.wi.weight" in h
PY
expect_exit 0 "inspect the t5-small checkpoint" -- "$KILN" inspect --model "$TMP/a"
expect_in "$TMP/out" "architecture: t5" "inspect reads it"
rm -rf "$TMP/a" "$TMP/b" "$TMP/c" "$TMP/fts"

expect_exit 2 "unknown preset" -- "$KILN" synth --preset gpt-5 -o "$TMP/x"
expect_in "$TMP/err" "flan-t5-small" "lists the presets"
expect_exit 2 "misspelt preset" -- "$KILN" synth --preset t5-smal -o "$TMP/x"
expect_in "$TMP/err" "--preset t5-smal: unknown preset (did you mean t5-small?)" "suggests the preset"
[ ! -e "$TMP/x" ] || fail "a refused synth created $TMP/x"
touch "$TMP/file"
expect_exit 2 "output is a file" -- "$KILN" synth --preset t5-small -o "$TMP/file"
expect_exit 2 "bad dtype" -- "$KILN" synth --preset t5-small -o "$TMP/x" --dtype int4
expect_exit 2 "no preset" -- "$KILN" synth -o "$TMP/x"

# --- an existing checkpoint is refused without --force, replaced whole with it ---
# The model directory of the issue: a copy of a real checkpoint.
rm -rf "$TMP/ow" && cp -r "$FIXTURES/t5-tiny" "$TMP/ow"
expect_exit 2 "synth into a checkpoint" -- "$KILN" synth --preset t5-small -o "$TMP/ow"
expect_in "$TMP/err" "-o $TMP/ow: the directory exists and is not empty" "names the directory"
expect_in "$TMP/err" "--force" "names --force"
for f in config.json model.safetensors spiece.model; do
  cmp -s "$FIXTURES/t5-tiny/$f" "$TMP/ow/$f" || fail "the refused synth changed $f"
done
expect_exit 2 "synth into a checkpoint given with a trailing slash" -- "$KILN" synth --preset t5-small -o "$TMP/ow/"
# --force never replaces the current directory (or its parent) from inside.
(cd "$TMP/ow" && "$KILN" synth --preset t5-small -o . --force) >"$TMP/out" 2>"$TMP/err"
code=$?
[ "$code" -eq 2 ] || fail "synth --force -o .: exit $code, expected 2"
expect_in "$TMP/err" "give the directory to write by its name" "synth -o . says why"
mkdir -p "$TMP/empty"
expect_exit 0 "synth into an empty directory" -- "$KILN" -q synth --preset t5-small -o "$TMP/empty"
[ -s "$TMP/empty/model.safetensors" ] || fail "synth into an empty directory wrote no weights"
touch "$TMP/ow/stale-file"
expect_exit 0 "synth --force over a checkpoint" -- "$KILN" -q synth --preset t5-small -o "$TMP/ow" --force
cmp -s "$TMP/empty/model.safetensors" "$TMP/ow/model.safetensors" || fail "--force: not t5-small's weights"
cmp -s "$TMP/empty/config.json" "$TMP/ow/config.json" || fail "--force: not t5-small's config"
[ ! -e "$TMP/ow/stale-file" ] || fail "--force kept a file of the replaced directory"
leftovers=$(compgen -G "$TMP/ow.*" || true)
[ -z "$leftovers" ] || fail "--force left $leftovers behind"
rm -rf "$TMP/empty"

# A checkpoint whose config and weights agree: the config's shapes are the weights' shapes.
consistent() {  # consistent DIR
  python3 - "$1" <<'PY'
import json, struct, sys
d = sys.argv[1]
c = json.load(open(d + "/config.json"))
f = open(d + "/model.safetensors", "rb")
h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
assert h["shared.weight"]["shape"] == [c["vocab_size"], c["d_model"]], (c, h["shared.weight"])
wi = "encoder.block.0.layer.1.DenseReluDense." + ("wi_0" if c["is_gated_act"] else "wi")
assert h[wi + ".weight"]["shape"] == [c["d_ff"], c["d_model"]], (c, h[wi + ".weight"])
n = c["num_layers"]
assert "encoder.block.%d.layer.0.SelfAttention.q.weight" % (n - 1) in h
assert "encoder.block.%d.layer.0.SelfAttention.q.weight" % n not in h
assert ("lm_head.weight" in h) != c["tie_word_embeddings"]
PY
}

# --- two synth runs into the same directory at once: one complete checkpoint, one clean failure ---
rm -rf "$TMP/race"
"$KILN" -q synth --preset t5-small -o "$TMP/race" >"$TMP/out1" 2>"$TMP/err1" &
p1=$!
"$KILN" -q synth --preset flan-t5-small --dtype bf16 -o "$TMP/race" >"$TMP/out2" 2>"$TMP/err2" &
p2=$!
wait $p1
c1=$?
wait $p2
c2=$?
if [ "$c1" -eq 0 ] && [ "$c2" -eq 0 ]; then
  fail "two concurrent synth -o of one directory both succeeded"
elif [ "$c1" -ne 0 ] && [ "$c2" -ne 0 ]; then
  fail "two concurrent synth -o both failed: $c1 ($(cat "$TMP/err1")) and $c2 ($(cat "$TMP/err2"))"
else
  loser=$([ "$c1" -eq 0 ] && echo 2 || echo 1)
  code=$([ "$c1" -eq 0 ] && echo "$c2" || echo "$c1")
  [ "$code" -eq 2 ] || fail "the losing concurrent synth: exit $code, expected 2"
  grep -q -- "--force" "$TMP/err$loser" || fail "the losing synth says why: $(cat "$TMP/err$loser")"
fi
consistent "$TMP/race" || fail "concurrent synth runs left a mixed checkpoint"
leftovers=$(compgen -G "$TMP/race.*" || true)
[ -z "$leftovers" ] || fail "concurrent synth runs left $leftovers behind"
rm -rf "$TMP/race"

# --- a failed write (here a file size limit; a full disk alike) leaves nothing behind ---
rm -rf "$TMP/limited"
(ulimit -f 10240; exec "$KILN" -q synth --preset t5-small -o "$TMP/limited") >"$TMP/out" 2>"$TMP/err"
code=$?
[ "$code" -eq 1 ] || fail "synth past the file size limit: exit $code, expected 1"
expect_in "$TMP/err" "model.safetensors" "the failed write names the file"
[ ! -e "$TMP/limited" ] || fail "a failed synth left $TMP/limited ($(ls "$TMP/limited" | tr '\n' ' '))"
leftovers=$(compgen -G "$TMP/limited.*" || true)
[ -z "$leftovers" ] || fail "a failed synth left $leftovers behind"

finish
