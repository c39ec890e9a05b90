#!/usr/bin/env bash
# A checkpoint's generation_config.json sets the defaults (as in HuggingFace); flags override
# them; the defaults travel in the plan.
source "$(dirname "$0")/lib.bash"

# t5-tiny with generation defaults: at most 3 new tokens, 4 beams with early_stopping true.
MODEL="$TMP/t5-gen"
rm -rf "$MODEL" && cp -r "$FIXTURES/t5-tiny" "$MODEL" && rm -f "$MODEL"/reference.*
python3 - "$MODEL/generation_config.json" <<'PY'
import json, sys
p = sys.argv[1]
g = json.load(open(p))
g.update({"max_new_tokens": 3, "num_beams": 4, "early_stopping": True})
json.dump(g, open(p, "w"))
PY
PROMPT="copy: vica vica vica vica"

expect_exit 0 "plain fixture (no generation defaults)" -- "$KILN" run --model "$FIXTURES/t5-tiny" --prompt "$PROMPT" --json
full=$(python3 -c "import json,sys; print(len(json.loads(open(sys.argv[1]).read())['output_ids']))" "$TMP/out")
[ "$full" -gt 3 ] || fail "the fixture's answer should be longer than 3 tokens, got $full"

expect_exit 0 "defaults from generation_config.json" -- "$KILN" run --model "$MODEL" --prompt "$PROMPT" --json
n=$(python3 -c "import json,sys; print(len(json.loads(open(sys.argv[1]).read())['output_ids']))" "$TMP/out")
[ "$n" -eq 3 ] || fail "max_new_tokens 3 from generation_config.json: got $n tokens"

expect_exit 0 "a flag overrides the default" -- "$KILN" run --model "$MODEL" --prompt "$PROMPT" --max-new-tokens 5 --json
n=$(python3 -c "import json,sys; print(len(json.loads(open(sys.argv[1]).read())['output_ids']))" "$TMP/out")
[ "$n" -eq 5 ] || fail "--max-new-tokens 5 over the config's 3: got $n tokens"

# The beam default is used: with -v the build log is quiet, so compare against explicit flags.
expect_exit 0 "config beams" -- "$KILN" run --model "$MODEL" --prompt "$PROMPT" --max-new-tokens 12
cp "$TMP/out" "$TMP/config_beams"
expect_exit 0 "explicit beams" -- "$KILN" run --model "$MODEL" --prompt "$PROMPT" --max-new-tokens 12 --beams 4 --early-stopping true
cmp -s "$TMP/out" "$TMP/config_beams" || fail "config num_beams 4 differs from --beams 4: $(cat "$TMP/config_beams") vs $(cat "$TMP/out")"

# Through a plan: the defaults are stored in it.
expect_exit 0 "build" -- "$KILN" build --model "$MODEL" -o "$TMP/gen.plan"
expect_exit 0 "run the plan" -- "$KILN" run --plan "$TMP/gen.plan" --prompt "$PROMPT" --json
n=$(python3 -c "import json,sys; print(len(json.loads(open(sys.argv[1]).read())['output_ids']))" "$TMP/out")
[ "$n" -eq 3 ] || fail "plan keeps max_new_tokens 3: got $n tokens"
expect_exit 0 "inspect shows them" -- "$KILN" inspect "$TMP/gen.plan"
expect_in "$TMP/out" '"num_beams": 4' "generation defaults in the plan metadata"

finish
