#!/usr/bin/env bash
# kiln synth: real-size HF-layout checkpoints with the public shapes, deterministic per seed,
# loadable by kiln (and HF) as is; bad presets and outputs are refused.
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
touch "$TMP/file"
expect_exit 2 "output is a file" -- "$KILN" synth --preset t5-small -o "$TMP/file"
expect_exit 2 "bad dtype" -- "$KILN" synth --preset t5-small -o "$TMP/x" --dtype int4
expect_exit 2 "no preset" -- "$KILN" synth -o "$TMP/x"

finish
