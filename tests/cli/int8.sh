#!/usr/bin/env bash
# `kiln build --precision int8` (W8A8) on both fixture models: calibrated on the fixture's
# calibration prompts with the cache written, the log counting prompts and tokens; a rebuild from
# the cache alone generating the same ids; dev-set accuracy within two points of the fp32 plan's
# (`kiln eval --compare --max-drop 0.02`); `kiln inspect --layers` showing the int8 inputs and why
# the logits Linear keeps an f32 one; a foreign cache refused; the --max-drop gate failing a worse
# plan; SmoothQuant through the cache; calibration options refused for other precisions.
source "$(dirname "$0")/lib.bash"

CALIB="$FIXTURES/data/calib.jsonl"
DEV="$FIXTURES/data/dev.jsonl"
head -n 60 "$DEV" | python3 -c '
import json, sys
for line in sys.stdin:
    print(json.dumps(json.loads(line)["prompt"]))' >"$TMP/prompts.jsonl"
for model in t5 bloom; do
  opts=()
  [ "$model" = bloom ] && opts=(--prompt-template "{prompt} =")
  fp32="$TMP/$model-fp32.plan" int8="$TMP/$model-int8.plan" again="$TMP/$model-int8-cache.plan"
  cache="$TMP/$model.calib"
  expect_exit 0 "build $model fp32" -- "$KILN" build --model "$FIXTURES/$model-tiny" "${opts[@]}" \
    -o "$fp32" || continue
  expect_exit 0 "build $model int8" -- "$KILN" build --model "$FIXTURES/$model-tiny" "${opts[@]}" \
    --precision int8 --calib "$CALIB" --calib-cache "$cache" -o "$int8" || continue
  expect_in "$TMP/err" "512 prompts" "$model: the log counts the calibration prompts"
  expect_in "$TMP/err" "generated tokens" "$model: the log counts the tokens"
  expect_in "$TMP/err" "Linears read int8 inputs" "$model: the log says what was quantized"
  expect_in "$cache" "method=entropy" "$model: the cache names its method"
  expect_exit 0 "rebuild $model from the cache" -- "$KILN" build --model "$FIXTURES/$model-tiny" \
    "${opts[@]}" --precision int8 --calib-cache "$cache" -o "$again" || continue
  expect_in "$TMP/err" "no prompts run" "$model: a cache-only rebuild runs no calibration"
  grep -q "calibrating" "$TMP/err" && fail "$model: the cache-only rebuild calibrated"
  for p in "$int8" "$again"; do
    expect_exit 0 "run $model $(basename "$p")" -- "$KILN" run --plan "$p" --input "$TMP/prompts.jsonl" \
      --json && cp "$TMP/out" "$p.run.jsonl"
  done
  cmp -s "$int8.run.jsonl" "$again.run.jsonl" ||
    fail "$model: the cache-only rebuild generates other ids than the calibrated plan"
  [ "$(wc -l <"$int8.run.jsonl")" -eq 60 ] || fail "$model: expected 60 generations"

  expect_exit 0 "eval --compare $model" -- "$KILN" eval --compare "$fp32" "$int8" --dataset "$DEV" \
    --max-drop 0.02 --json && cp "$TMP/out" "$TMP/$model-compare.json"
  python3 - "$TMP/$model-compare.json" "$model" <<'PY' || fail "$model: eval --compare output"
import json, sys
j = json.loads(open(sys.argv[1]).readline())
a, b = j["a"]["overall"], j["b"]["overall"]
print(f"{sys.argv[2]}: fp32 {a:.4f}  int8 {b:.4f}  delta {b - a:+.4f}  top-1 agreement "
      f"{j['top1_agreement']:.4f} of {j['top1_positions']}  identical {j['identical_outputs']}/{j['n']}")
assert j["n"] == 600 and j["passed"] and j["max_drop"] == 0.02, j
assert a - b <= 0.02, (a, b)
assert set(j["a"]["per_task"]) == set(j["b"]["per_task"]) == set(j["delta"]["per_task"]), j
assert 0.9 < j["top1_agreement"] <= 1.0, j
PY
  expect_exit 0 "inspect $model int8" -- "$KILN" inspect --layers "$int8"
  expect_in "$TMP/out" "× i8 input" "$model: inspect counts the int8-input Linears"
  expect_in "$TMP/out" "the logits Linear" "$model: inspect says why the logits Linear keeps f32"
done

# SmoothQuant (bloom, alpha 0.5): the cache records it, a cache-only rebuild generates the same
# ids, and the plan stays within two points of fp32; --smoothquant needs --calib.
sq="$TMP/bloom-sq.plan"
expect_exit 0 "build bloom int8 --smoothquant" -- "$KILN" build --model "$FIXTURES/bloom-tiny" \
  --prompt-template "{prompt} =" --precision int8 --calib "$CALIB" --smoothquant 0.5 \
  --calib-cache "$TMP/bloom-sq.calib" -o "$sq" &&
  expect_in "$TMP/err" "smoothing[decoder]: 12 norms" "the log says what was smoothed" &&
  expect_in "$TMP/bloom-sq.calib" "smoothquant=0.5" "the cache records alpha"
expect_exit 0 "rebuild bloom smoothquant from the cache" -- "$KILN" build --model "$FIXTURES/bloom-tiny" \
  --prompt-template "{prompt} =" --precision int8 --calib-cache "$TMP/bloom-sq.calib" -o "$sq.again"
for p in "$sq" "$sq.again"; do
  expect_exit 0 "run $(basename "$p")" -- "$KILN" run --plan "$p" --input "$TMP/prompts.jsonl" --json &&
    cp "$TMP/out" "$p.run.jsonl"
done
cmp -s "$sq.run.jsonl" "$sq.again.run.jsonl" || fail "smoothquant: the cache-only rebuild generates other ids"
expect_exit 0 "eval --compare smoothquant" -- "$KILN" eval --compare "$TMP/bloom-fp32.plan" "$sq" \
  --dataset "$DEV" --max-drop 0.02 && tail -n 2 "$TMP/out"
expect_exit 2 "--smoothquant without --calib" -- "$KILN" build --model "$FIXTURES/bloom-tiny" \
  --precision int8 --calib-cache "$TMP/bloom-sq.calib" --smoothquant 0.5 -o "$TMP/x.plan" &&
  expect_in "$TMP/err" "--calib FILE.jsonl" "--smoothquant says it needs --calib"

# A cache made for another model is refused, naming it, and leaves no plan.
expect_exit 2 "foreign cache" -- "$KILN" build --model "$FIXTURES/bloom-tiny" --precision int8 \
  --calib-cache "$TMP/t5.calib" -o "$TMP/foreign.plan" &&
  expect_in "$TMP/err" "another model" "the foreign cache's refusal says so"
[ -e "$TMP/foreign.plan" ] && fail "a refused build left a plan behind"
# Calibration belongs to int8.
expect_exit 2 "--calib with bf16" -- "$KILN" build --model "$FIXTURES/t5-tiny" --precision bf16 \
  --calib "$CALIB" -o "$TMP/bf16.plan" &&
  expect_in "$TMP/err" "--precision bf16" "names the precision"
# A plan against itself agrees on every choice: the positions compared are each row's generated
# tokens and its stop (counted here from `kiln run`'s output_ids at eval's 64 new tokens).
head -n 60 "$DEV" >"$TMP/dev60.jsonl"
expect_exit 0 "eval --compare self" -- "$KILN" eval --compare "$TMP/t5-fp32.plan" "$TMP/t5-fp32.plan" \
  --dataset "$TMP/dev60.jsonl" --max-drop 0 --json && cp "$TMP/out" "$TMP/self.json"
expect_exit 0 "run for the positions" -- "$KILN" run --plan "$TMP/t5-fp32.plan" --input "$TMP/prompts.jsonl" \
  --max-new-tokens 64 --json && cp "$TMP/out" "$TMP/self.run.jsonl"
python3 - "$TMP/self.json" "$TMP/self.run.jsonl" <<'PY' || fail "eval --compare of a plan with itself"
import json, sys
j = json.loads(open(sys.argv[1]).readline())
runs = [json.loads(l) for l in open(sys.argv[2])]
positions = sum(len(r["output_ids"]) + 1 for r in runs)
assert j["top1_agreement"] == 1.0 and j["identical_outputs"] == 60 and j["passed"], j
assert j["top1_positions"] == positions, (j["top1_positions"], positions)
assert j["delta"]["overall"] == 0 and all(v == 0 for v in j["delta"]["per_task"].values()), j
PY
# The gate: a bloom plan built without its prompt template answers few rows, far below the
# fp32 plan: --max-drop fails it (exit 1) after printing both.
expect_exit 0 "build bloom without template" -- "$KILN" build --model "$FIXTURES/bloom-tiny" \
  -o "$TMP/bloom-plain.plan"
expect_exit 1 "eval --compare gate" -- "$KILN" eval --compare "$TMP/bloom-fp32.plan" \
  "$TMP/bloom-plain.plan" --dataset "$TMP/dev60.jsonl" --max-drop 0.02 &&
  expect_in "$TMP/err" "--max-drop 0.02" "the gate names --max-drop" &&
  expect_in "$TMP/out" "top-1 agreement" "the table is printed before the gate fails"
finish
