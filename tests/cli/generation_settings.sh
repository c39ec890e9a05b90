#!/usr/bin/env bash
# HF's generation settings that act on the logits, as `kiln run` flags and as a checkpoint's
# generation_config.json (kept in the plan), against HuggingFace's ids
# (tests/data/hf_generation/reference.json, made by transformers); unsupported settings warn at
# build time; bad values are usage errors; sampling seeds.
source "$(dirname "$0")/lib.bash"
REF="$(cd "$(dirname "$0")/../data/hf_generation" && pwd)/reference.json"

# HF's output_ids for a case of the reference: model, prompt, mode, setting (JSON).
hf_ids() {
  python3 - "$REF" "$1" "$2" "$3" "$4" <<'PY'
import json, sys
ref, model, prompt, mode, setting = sys.argv[1:]
for c in json.load(open(ref))["models"][model]["cases"]:
    if c["prompt"] == prompt and c["mode"] == mode and c["setting"] == json.loads(setting):
        print(json.dumps(c["output_ids"]))
        break
else:
    sys.exit("no such reference case")
PY
}
ids_of_out() { python3 -c "import json,sys; print(json.dumps(json.loads(open(sys.argv[1]).readline())['output_ids']))" "$TMP/out"; }

# --- flags against HF ---
P="copy: vica vica vica vica"
want=$(hf_ids bloom-tiny "$P" greedy '{"no_repeat_ngram_size": 2, "min_new_tokens": 10}')
expect_exit 0 "bloom no-repeat flags" -- "$KILN" run --model "$FIXTURES/bloom-tiny" --prompt-template "{prompt} =" \
  --prompt "$P" --no-repeat-ngram-size 2 --min-new-tokens 10 --json
[ "$(ids_of_out)" = "$want" ] || fail "bloom --no-repeat-ngram-size 2: $(ids_of_out), HF $want"
plain=$("$KILN" run --model "$FIXTURES/bloom-tiny" --prompt-template "{prompt} =" --prompt "$P" --min-new-tokens 10 --json 2>/dev/null)
[ "$(python3 -c "import json,sys; print(json.dumps(json.loads(sys.argv[1])['output_ids']))" "$plain")" != "$want" ] \
  || fail "the n-gram ban should change this output (else the test proves nothing)"

want=$(hf_ids t5-tiny "$P" beam4 '{"repetition_penalty": 1.3, "min_new_tokens": 10}')
expect_exit 0 "t5 repetition penalty, beams" -- "$KILN" run --model "$FIXTURES/t5-tiny" --prompt "$P" \
  --repetition-penalty 1.3 --min-new-tokens 10 --beams 4 --json
[ "$(ids_of_out)" = "$want" ] || fail "t5 --repetition-penalty 1.3 --beams 4: $(ids_of_out), HF $want"

P2="reverse: suvogi"
want=$(hf_ids t5-tiny "$P2" greedy '{"forced_eos_token_id": 7, "max_new_tokens": 6, "min_new_tokens": 6}')
expect_exit 0 "t5 forced eos" -- "$KILN" run --model "$FIXTURES/t5-tiny" --prompt "$P2" \
  --forced-eos-token-id 7 --max-new-tokens 6 --min-new-tokens 6 --json
[ "$(ids_of_out)" = "$want" ] || fail "t5 --forced-eos-token-id 7: $(ids_of_out), HF $want"

# --- generation_config.json: the same settings as defaults, through a plan ---
MODEL="$TMP/t5-gen"
rm -rf "$MODEL" && cp -r "$FIXTURES/t5-tiny" "$MODEL" && rm -f "$MODEL"/reference.*
python3 - "$MODEL/generation_config.json" <<'PY'
import json, sys
p = sys.argv[1]
g = json.load(open(p))
g.update({"repetition_penalty": 1.3, "min_new_tokens": 10, "num_beams": 4, "typical_p": 0.9,
          "encoder_repetition_penalty": 1.0})
json.dump(g, open(p, "w"))
PY
want=$(hf_ids t5-tiny "$P" beam4 '{"repetition_penalty": 1.3, "min_new_tokens": 10}')
expect_exit 0 "build with generation_config settings" -- "$KILN" build --model "$MODEL" -o "$TMP/gen.plan"
expect_in "$TMP/err" "typical_p (0.9) is not supported by kiln and is ignored" "unsupported setting warned"
grep -q "encoder_repetition_penalty" "$TMP/err" && fail "a setting at HF's default must not warn: $(cat "$TMP/err")"
expect_exit 0 "run the plan" -- "$KILN" run --plan "$TMP/gen.plan" --prompt "$P" --json
[ "$(ids_of_out)" = "$want" ] || fail "plan defaults from generation_config.json: $(ids_of_out), HF $want"
expect_exit 0 "inspect" -- "$KILN" inspect "$TMP/gen.plan"
expect_in "$TMP/out" '"repetition_penalty": 1.3' "the setting is in the plan's metadata"
plain_t5=$("$KILN" run --model "$FIXTURES/t5-tiny" --prompt "$P" --json 2>/dev/null)
expect_exit 0 "flags override the defaults" -- "$KILN" run --plan "$TMP/gen.plan" --prompt "$P" \
  --repetition-penalty 1 --min-new-tokens 0 --beams 1 --json
[ "$(ids_of_out)" = "$(python3 -c "import json,sys; print(json.dumps(json.loads(sys.argv[1])['output_ids']))" "$plain_t5")" ] \
  || fail "flags back to HF's defaults should give the plain greedy output: $(ids_of_out) vs $plain_t5"

# --- bad values: usage errors naming the flag ---
expect_exit 2 "not JSON" -- "$KILN" run --model "$FIXTURES/t5-tiny" --prompt "$P" --suppress-tokens "3 7"
expect_in "$TMP/err" "--suppress-tokens: '3 7' is not JSON" "names the flag"
expect_exit 2 "outside the vocabulary" -- "$KILN" run --model "$FIXTURES/t5-tiny" --prompt "$P" --suppress-tokens "[3, 5000]"
expect_in "$TMP/err" "token id 5000 is outside the vocabulary" "names the id"
expect_exit 2 "flat bad words" -- "$KILN" run --model "$FIXTURES/t5-tiny" --prompt "$P" --bad-words-ids "[3, 7]"
expect_in "$TMP/err" "--bad-words-ids: each entry is a non-empty list" "says the shape"
expect_exit 2 "zero penalty" -- "$KILN" run --model "$FIXTURES/t5-tiny" --prompt "$P" --repetition-penalty 0
BAD="$TMP/t5-badgen"
rm -rf "$BAD" && cp -r "$FIXTURES/t5-tiny" "$BAD" && rm -f "$BAD"/reference.*
python3 -c "import json,sys; p=sys.argv[1]; g=json.load(open(p)); g['suppress_tokens']=[9999]; json.dump(g, open(p,'w'))" "$BAD/generation_config.json"
expect_exit 1 "a checkpoint's id outside the vocabulary" -- "$KILN" build --model "$BAD" -o "$TMP/bad.plan"
expect_in "$TMP/err" "'suppress_tokens' holds token id 9999" "names the setting"

# --- sampling seeds ---
S="reverse: suvogi"
run_sample() { "$KILN" run --model "$FIXTURES/t5-tiny" --prompt "$S" --prompt "$S" --prompt "$S" --temperature 3 "$@" 2>"$TMP/seed_err"; }
a=$(run_sample) || fail "sampling run failed"
b=$(run_sample) || fail "sampling run failed"
[ "$a" != "$b" ] || fail "two runs without --seed sampled the same: $a"
[ "$(printf '%s\n' "$a" | sort -u | wc -l)" -gt 1 ] || fail "three identical prompts got identical samples: $a"
c=$(run_sample --seed 7)
d=$(run_sample --seed 7)
[ "$c" = "$d" ] || fail "--seed 7 twice differs: $c / $d"
e=$(run_sample -v) || fail "sampling run with -v failed"
seed=$(sed -n 's/.*sampling seed: \([0-9]*\) (repeat this run with --seed [0-9]*).*/\1/p' "$TMP/seed_err")
[ -n "$seed" ] || fail "-v does not print the seed: $(cat "$TMP/seed_err")"
f=$(run_sample --seed "$seed")
[ "$e" = "$f" ] || fail "--seed $seed does not repeat the -v run: $e / $f"
expect_exit 0 "help says it" -- "$KILN" run --help
expect_in "$TMP/out" "identical prompts differ" "--seed help"

finish
