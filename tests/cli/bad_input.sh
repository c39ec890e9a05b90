#!/usr/bin/env bash
# Bad input through the CLI: a clear message naming what is at fault, the documented exit code
# (1 runtime: missing/unreadable/damaged files; 2 usage: flags, prompts and rows), never a crash
# (`make asan` runs this script under AddressSanitizer).
source "$(dirname "$0")/lib.bash"

# --- missing and damaged files: exit 1, naming the file (issue 7, items 12 and 14) ---
expect_exit 1 "missing model" -- "$KILN" run --model "$TMP/missing" --prompt hi
expect_in "$TMP/err" "$TMP/missing" "names the directory"
expect_exit 1 "missing plan" -- "$KILN" run --plan "$TMP/missing.plan" --prompt hi
expect_in "$TMP/err" "--plan $TMP/missing.plan: no such file" "names the flag and the file"
printf 'garbage' > "$TMP/garbage.plan"
expect_exit 1 "corrupt plan" -- "$KILN" run --plan "$TMP/garbage.plan" --prompt hi
expect_in "$TMP/err" "not a kiln plan" "corrupt plan message"

mkdir -p "$TMP/llama"
printf '{"model_type": "llama", "hidden_size": 8}' > "$TMP/llama/config.json"
expect_exit 1 "unknown architecture" -- "$KILN" build --model "$TMP/llama" -o "$TMP/llama.plan"
expect_in "$TMP/err" "llama" "names the model_type"

mkdir -p "$TMP/trunc"
cp "$FIXTURES/t5-tiny/config.json" "$FIXTURES/t5-tiny/spiece.model" "$TMP/trunc/"
head -c 100000 "$FIXTURES/t5-tiny/model.safetensors" > "$TMP/trunc/model.safetensors"
expect_exit 1 "truncated safetensors" -- "$KILN" build --model "$TMP/trunc" -o "$TMP/trunc.plan"
expect_in "$TMP/err" "model.safetensors" "names the file"

expect_exit 0 "build small profile" -- "$KILN" build --model "$FIXTURES/t5-tiny" --max-input-tokens 8 -o "$TMP/short.plan"
printf '"copy: de"\n' > "$TMP/ok.jsonl"
mkdir -p "$TMP/adir"
# Item 12: a missing or unreadable --input/--dataset is a runtime error (1), naming the flag.
expect_exit 1 "missing --input" -- "$KILN" run --plan "$TMP/short.plan" --input "$TMP/nope.jsonl"
expect_in "$TMP/err" "--input $TMP/nope.jsonl: no such file" "names flag and file"
expect_exit 1 "missing --dataset" -- "$KILN" eval --plan "$TMP/short.plan" --dataset "$TMP/nope.jsonl"
expect_in "$TMP/err" "--dataset $TMP/nope.jsonl: no such file" "names flag and file"
expect_exit 1 "missing tokenize --input" -- "$KILN" tokenize --plan "$TMP/short.plan" --input "$TMP/nope.jsonl"
# Unreadable files (reading /proc/self/mem at offset 0 fails with EIO, even for root).
expect_exit 1 "unreadable --input" -- "$KILN" run --plan "$TMP/short.plan" --input /proc/self/mem
expect_in "$TMP/err" "cannot read /proc/self/mem" "names the file"
expect_exit 1 "unreadable --dataset" -- "$KILN" eval --plan "$TMP/short.plan" --dataset /proc/self/mem
expect_exit 1 "unreadable --plan" -- "$KILN" run --plan /proc/self/mem --prompt hi
expect_in "$TMP/err" "/proc/self/mem" "names the file"
if [ "$(id -u)" != 0 ]; then
  cp "$TMP/ok.jsonl" "$TMP/locked.jsonl" && chmod 000 "$TMP/locked.jsonl"
  expect_exit 1 "--input without read permission" -- "$KILN" run --plan "$TMP/short.plan" --input "$TMP/locked.jsonl"
  expect_in "$TMP/err" "locked.jsonl" "names the file"
fi
# Item 14: what is actually wrong, not "has no rows" / "no prompts" / "does not exist".
expect_exit 1 "eval --dataset DIR" -- "$KILN" eval --plan "$TMP/short.plan" --dataset "$TMP/adir"
expect_in "$TMP/err" "is a directory" "eval --dataset DIR says it is a directory"
expect_exit 1 "run --input DIR" -- "$KILN" run --plan "$TMP/short.plan" --input "$TMP/adir"
expect_in "$TMP/err" "is a directory" "run --input DIR says it is a directory"
expect_exit 2 "build --model FILE" -- "$KILN" build --model "$FIXTURES/t5-tiny/config.json" -o "$TMP/x.plan"
expect_in "$TMP/err" "this is a file" "says it is a file"
expect_in "$TMP/err" "--model $FIXTURES/t5-tiny" "suggests the directory"
expect_exit 2 "tokenize --model PLAN" -- "$KILN" tokenize --model "$TMP/short.plan" --text hi
expect_in "$TMP/err" "use --plan $TMP/short.plan" "suggests --plan"
expect_exit 2 "run --model PLAN" -- "$KILN" run --model "$TMP/short.plan" --prompt hi
expect_in "$TMP/err" "use --plan" "suggests --plan"
# A directory given to --plan is a path that cannot be read as a file, like --input DIR: exit 1
# (issue 36, item 4), saying it is a directory.
expect_exit 1 "run --plan CHECKPOINT_DIR" -- "$KILN" run --plan "$FIXTURES/t5-tiny" --prompt hi
expect_in "$TMP/err" "--plan $FIXTURES/t5-tiny: this is a directory" "run --plan DIR says it is a directory"
expect_in "$TMP/err" "use --model $FIXTURES/t5-tiny" "suggests --model"
expect_exit 1 "run --plan DIR" -- "$KILN" run --plan "$TMP/adir" --prompt hi
expect_in "$TMP/err" "--plan $TMP/adir: this is a directory" "run --plan DIR says it is a directory"
head -n 2 "$FIXTURES/data/dev.jsonl" > "$TMP/dev2.jsonl"
expect_exit 1 "eval --plan DIR" -- "$KILN" eval --plan "$TMP/adir" --dataset "$TMP/dev2.jsonl"
expect_exit 1 "tokenize --plan DIR" -- "$KILN" tokenize --plan "$TMP/adir" --text hi

# A T5 checkpoint without spiece.model names it (not tokenizer.json's Unigram model), for build,
# run --model and tokenize --model alike (issue 36, item 4).
rm -rf "$TMP/nospiece" && cp -r "$FIXTURES/t5-tiny" "$TMP/nospiece" && rm "$TMP/nospiece/spiece.model"
for cmd in "build -o $TMP/nospiece.plan" "run --prompt hi" "tokenize --text hi"; do
  read -r -a args <<< "$cmd"
  expect_exit 1 "${args[0]} of a T5 checkpoint without spiece.model" -- "$KILN" "${args[0]}" --model "$TMP/nospiece" "${args[@]:1}"
  expect_in "$TMP/err" "$TMP/nospiece: no spiece.model" "${args[0]} names the missing spiece.model"
  expect_in "$TMP/err" "huggingface-cli download" "${args[0]} says how to get spiece.model"
  if grep -q "Unigram\" is\|only \"BPE\"" "$TMP/err"; then fail "${args[0]}: reports tokenizer.json instead"; fi
done
rm -rf "$TMP/nospiece"
# PyTorch weights only: kiln reads safetensors, and says how to convert (the command was run with
# transformers 5.17 on a .bin of t5-tiny: the 98 tensors came back identical).
rm -rf "$TMP/ptonly" && mkdir -p "$TMP/ptonly"
cp "$FIXTURES/t5-tiny/config.json" "$FIXTURES/t5-tiny/spiece.model" "$TMP/ptonly/"
printf 'not really a pickle' > "$TMP/ptonly/pytorch_model.bin"
expect_exit 1 "build of a pytorch_model.bin checkpoint" -- "$KILN" build --model "$TMP/ptonly" -o "$TMP/pt.plan"
expect_in "$TMP/err" "It has pytorch_model.bin: kiln reads only safetensors weights" "names the .bin and the format"
expect_in "$TMP/err" "save_pretrained(d, safe_serialization=True)" "says how to convert"
expect_in "$TMP/err" "d = '$TMP/ptonly'" "the conversion names the directory"
rm -rf "$TMP/ptonly"
printf '\n\n' > "$TMP/blank.jsonl"
expect_exit 2 "run --input of blank lines" -- "$KILN" run --plan "$TMP/short.plan" --input "$TMP/blank.jsonl"
expect_in "$TMP/err" "no prompts (every line is blank)" "says why"
expect_exit 2 "eval --dataset of blank lines" -- "$KILN" eval --plan "$TMP/short.plan" --dataset "$TMP/blank.jsonl"
expect_in "$TMP/err" "no rows (every line is blank)" "says why"

# --- prompts, rows and flags: exit 2, naming the place (items 3, 13) ---
expect_exit 2 "prompt beyond the plan's max" -- "$KILN" run --plan "$TMP/short.plan" --prompt "copy: puboka puboka puboka puboka"
expect_in "$TMP/err" "at most 8" "says the limit"
printf '"copy: de"\n\n"copy: puboka puboka puboka puboka"\n' > "$TMP/long.jsonl"
expect_exit 2 "too-long prompt in --input" -- "$KILN" run --plan "$TMP/short.plan" --input "$TMP/long.jsonl" --json
expect_in "$TMP/err" "long.jsonl:3: the prompt is 20 tokens" "names file:line"
[ ! -s "$TMP/out" ] || fail "too-long prompt on line 3: nothing is generated or printed before the error"
printf '{"task": "copy", "prompt": "copy: de", "answer": "de"}\n{"task": "copy", "prompt": "copy: puboka puboka puboka puboka", "answer": "x"}\n' > "$TMP/long_ds.jsonl"
expect_exit 2 "too-long prompt in eval" -- "$KILN" eval --plan "$TMP/short.plan" --dataset "$TMP/long_ds.jsonl"
expect_in "$TMP/err" "long_ds.jsonl:2: the prompt is 20 tokens" "eval names file:line"
printf '"copy: de"\n""\n' > "$TMP/empty.jsonl"
expect_exit 2 "empty string in --input" -- "$KILN" run --plan "$TMP/short.plan" --input "$TMP/empty.jsonl"
expect_in "$TMP/err" "empty.jsonl:2: the prompt is empty" "names file:line"
expect_exit 2 "empty prompt" -- "$KILN" run --plan "$TMP/short.plan" --prompt "copy: de" --prompt ""
expect_in "$TMP/err" "--prompt 2: the prompt is empty" "names which --prompt"
printf '[6, 17, 1]\n"not ids"\n' > "$TMP/bad_ids.jsonl"
expect_exit 2 "tokenize --decode --input bad line" -- "$KILN" tokenize --plan "$TMP/short.plan" --decode --input "$TMP/bad_ids.jsonl"
expect_in "$TMP/err" "bad_ids.jsonl:2" "names file:line"
[ ! -s "$TMP/out" ] || fail "tokenize --decode --input: nothing printed before the bad line's error"
expect_exit 2 "negative id" -- "$KILN" tokenize --plan "$TMP/short.plan" --decode --text "[6, -1]"
expect_in "$TMP/err" "integers >= 0" "says what ids are"

# Item 3: invalid UTF-8 is refused up front, naming the prompt and the byte offset, in run, eval
# and tokenize (nothing generated or printed first).
expect_exit 2 "invalid UTF-8 --prompt" -- "$KILN" run --plan "$TMP/short.plan" --prompt "copy: de" --prompt $'copy: d\xffe' --json
expect_in "$TMP/err" "--prompt 2: invalid UTF-8: byte 0xFF at offset 7" "names prompt and offset"
[ ! -s "$TMP/out" ] || fail "invalid UTF-8: the earlier prompt's result is not printed before the error"
expect_exit 2 "invalid UTF-8 without --json" -- "$KILN" run --plan "$TMP/short.plan" --prompt $'copy: \xc3'
expect_in "$TMP/err" "invalid UTF-8: byte 0xC3 at offset 6" "same without --json"
printf '"copy: de"\n"copy: d\xffe"\n' > "$TMP/bad_utf8.jsonl"
expect_exit 2 "invalid UTF-8 in --input" -- "$KILN" run --plan "$TMP/short.plan" --input "$TMP/bad_utf8.jsonl"
expect_in "$TMP/err" "bad_utf8.jsonl:2: invalid UTF-8: byte 0xFF at offset 8" "names file:line and offset"
printf '{"task": "copy", "prompt": "copy: d\xffe", "answer": "de"}\n' > "$TMP/bad_utf8_ds.jsonl"
expect_exit 2 "invalid UTF-8 in eval" -- "$KILN" eval --plan "$TMP/short.plan" --dataset "$TMP/bad_utf8_ds.jsonl"
expect_in "$TMP/err" "bad_utf8_ds.jsonl:1: invalid UTF-8" "eval names file:line"
expect_exit 2 "invalid UTF-8 in tokenize --text" -- "$KILN" tokenize --plan "$TMP/short.plan" --text ok --text $'\xe2\x82'
expect_in "$TMP/err" "--text 2: invalid UTF-8: byte 0xE2 at offset 0" "tokenize names the text"
[ ! -s "$TMP/out" ] || fail "tokenize: nothing printed before the invalid text's error"
expect_exit 2 "overlong UTF-8" -- "$KILN" tokenize --plan "$TMP/short.plan" --text $'\xc0\xaf'
expect_exit 2 "UTF-8 surrogate" -- "$KILN" tokenize --plan "$TMP/short.plan" --text $'\xed\xa0\x80'

expect_exit 2 "max-new-tokens 0" -- "$KILN" run --plan "$TMP/short.plan" --prompt "copy: de" --max-new-tokens 0
expect_in "$TMP/err" "--max-new-tokens: must be in 1..8192, got 0" "says the range"
expect_exit 2 "negative max-new-tokens" -- "$KILN" run --plan "$TMP/short.plan" --prompt "copy: de" --max-new-tokens -1
expect_exit 2 "too many beams" -- "$KILN" run --plan "$TMP/short.plan" --prompt "copy: de" --beams 1000
expect_in "$TMP/err" "--beams: must be in 1..32" "names the flag and range"
expect_exit 2 "batch-size 0" -- "$KILN" eval --plan "$TMP/short.plan" --dataset "$TMP/long_ds.jsonl" --batch-size 0
expect_in "$TMP/err" "--batch-size: must be in 1..1024" "names the flag and range"
expect_exit 2 "negative seed" -- "$KILN" run --plan "$TMP/short.plan" --prompt "copy: de" --temperature 1 --seed -1
expect_in "$TMP/err" "--seed: must be >= 0, got -1" "refuses a negative seed"
expect_exit 2 "top-p 2" -- "$KILN" run --plan "$TMP/short.plan" --prompt "copy: de" --temperature 1 --top-p 2
expect_in "$TMP/err" "--top-p: must be a number in (0, 1]" "names the range"
expect_exit 2 "temperature abc" -- "$KILN" run --plan "$TMP/short.plan" --prompt "copy: de" --temperature abc
expect_in "$TMP/err" "--temperature: must be a number in 0..100, got abc" "names the range"
expect_exit 2 "unknown early-stopping" -- "$KILN" run --plan "$TMP/short.plan" --prompt "copy: de" --beams 2 --early-stopping sometimes
expect_in "$TMP/err" "early-stopping" "names the flag"
# --tf32 is for cuda fp32 plans only: refused before any work, naming what it needs.
expect_exit 2 "build --tf32 on the cpu" -- "$KILN" build --model "$FIXTURES/t5-tiny" --tf32 -o "$TMP/x.plan"
expect_in "$TMP/err" "--tf32 is for --device cuda --precision fp32" "build --tf32 on the cpu"
[ ! -e "$TMP/x.plan" ] || fail "build --tf32 on the cpu wrote a plan"

# Item 7: a template needs {prompt}, on build, run and eval alike.
expect_exit 2 "run: template without {prompt}" -- "$KILN" run --plan "$TMP/short.plan" --prompt "x" --prompt-template "no placeholder"
expect_in "$TMP/err" "--prompt-template 'no placeholder': the template must contain {prompt}" "names the flag"
expect_exit 2 "eval: template without {prompt}" -- "$KILN" eval --plan "$TMP/short.plan" --dataset "$TMP/long_ds.jsonl" --prompt-template "x ="
expect_in "$TMP/err" "--prompt-template" "names the flag"
expect_exit 2 "build: template without {prompt}" -- "$KILN" build --model "$FIXTURES/t5-tiny" --prompt-template "x =" -o "$TMP/x.plan"
expect_in "$TMP/err" "--prompt-template" "names the flag"
[ ! -e "$TMP/x.plan" ] || fail "build with a bad template wrote a plan"
printf 'not json\n' > "$TMP/bad.jsonl"
expect_exit 2 "malformed input file" -- "$KILN" run --plan "$TMP/short.plan" --input "$TMP/bad.jsonl"
expect_in "$TMP/err" "bad.jsonl:1" "names file:line"
printf '{"task": "x"}\n' > "$TMP/bad_ds.jsonl"
expect_exit 2 "malformed dataset" -- "$KILN" eval --plan "$TMP/short.plan" --dataset "$TMP/bad_ds.jsonl"
expect_in "$TMP/err" "bad_ds.jsonl:1" "names file:line"

# Item 8: --max-input-tokens 0 is refused like -5 (not the model's maximum in disguise).
for n in 0 -5 65537; do
  expect_exit 2 "--max-input-tokens $n" -- "$KILN" build --model "$FIXTURES/t5-tiny" --max-input-tokens "$n" -o "$TMP/x.plan"
  expect_in "$TMP/err" "--max-input-tokens: must be in 1..65536, got $n" "says the range"
done
# Item 9: --threads has a clear range (this machine's hardware threads), and so does
# KILN_NUM_THREADS.
hw=$(nproc --all 2>/dev/null || nproc)
for n in -1 0 $((hw + 1)) 1000; do
  expect_exit 2 "--threads $n" -- "$KILN" --threads "$n" run --plan "$TMP/short.plan" --prompt "copy: de"
  expect_in "$TMP/err" "--threads: must be in 1..$hw, got $n" "says the range"
  if grep -qE '[0-9]{20}' "$TMP/err"; then fail "--threads $n: a huge number in the message"; fi
done
expect_exit 2 "KILN_NUM_THREADS beyond the machine" -- env KILN_NUM_THREADS=$((hw + 1)) "$KILN" run --plan "$TMP/short.plan" --prompt "copy: de"
expect_in "$TMP/err" "KILN_NUM_THREADS=$((hw + 1))" "names the variable"
expect_exit 0 "--threads $hw" -- "$KILN" run --plan "$TMP/short.plan" --prompt "copy: de" --threads "$hw"

# --- build -o is checked before building; no temporary file is left on any failure (item 5) ---
mkdir -p "$TMP/outdir"
touch "$TMP/afile"
mkfifo "$TMP/fifo" 2>/dev/null || true
check_o() {  # check_o CODE MESSAGE TARGET
  expect_exit "$1" "build -o '$3'" -- "$KILN" build --model "$FIXTURES/t5-tiny" -o "$3"
  expect_in "$TMP/err" "$2" "build -o '$3' says what is wrong"
  if grep -q "loading t5 checkpoint" "$TMP/err"; then fail "build -o '$3': checked only after loading"; fi
}
check_o 2 "is a directory" "$TMP/outdir"
check_o 2 "-o path is empty" ""
check_o 2 "directory '$TMP/nodir' does not exist" "$TMP/nodir/x.plan"
check_o 2 "'$TMP/afile' is not a directory" "$TMP/afile/x.plan"
check_o 2 "is not a regular file" "$TMP/fifo"
[ -p "$TMP/fifo" ] || fail "build -o FIFO replaced the FIFO"
check_o 1 "cannot create a file there" "/proc/kiln-test.plan"
# A write that fails half way (file size limit; SIGXFSZ is ignored so it is a plain error).
(ulimit -f 1000 && "$KILN" build --model "$FIXTURES/t5-tiny" -o "$TMP/big.plan" >"$TMP/out" 2>"$TMP/err")
code=$?
[ "$code" -eq 1 ] || fail "build past the file size limit: exit $code, expected 1"
expect_in "$TMP/err" "cannot write $TMP/big.plan" "names the plan"
[ ! -e "$TMP/big.plan" ] || fail "a half-written plan was left at $TMP/big.plan"
leftovers=$(find "$TMP" / -maxdepth 1 -name '*.partial.*' 2>/dev/null)
[ -z "$leftovers" ] || fail "temporary files left behind: $leftovers"

# --- build -o that is one of the build's inputs: refused before any work (issue 36, item 3) ---
rm -rf "$TMP/ow" "$TMP/owlink" "$TMP/hardlink.safetensors" && cp -r "$FIXTURES/t5-tiny" "$TMP/ow"
check_input_o() {  # check_input_o DESCRIPTION MODEL TARGET
  expect_exit 2 "build $1" -- "$KILN" build --model "$2" -o "$3"
  expect_in "$TMP/err" "which the build reads from --model $2" "build $1 says why"
  if grep -q "loading t5 checkpoint" "$TMP/err"; then fail "build $1: checked only after loading"; fi
}
check_input_o "-o MODEL/model.safetensors" "$TMP/ow" "$TMP/ow/model.safetensors"
check_input_o "-o MODEL/config.json" "$TMP/ow" "$TMP/ow/config.json"
check_input_o "-o MODEL/spiece.model" "$TMP/ow" "$TMP/ow/spiece.model"
check_input_o "-o MODEL/generation_config.json" "$TMP/ow" "$TMP/ow/generation_config.json"
check_input_o "-o MODEL/./model.safetensors" "$TMP/ow" "$TMP/ow/./model.safetensors"
ln -s "$TMP/ow" "$TMP/owlink"
check_input_o "-o a weights file through a symlinked model dir" "$TMP/owlink" "$TMP/ow/model.safetensors"
ln "$TMP/ow/model.safetensors" "$TMP/hardlink.safetensors"
check_input_o "-o a hard link of the weights" "$TMP/ow" "$TMP/hardlink.safetensors"
for f in config.json model.safetensors spiece.model generation_config.json; do
  cmp -s "$FIXTURES/t5-tiny/$f" "$TMP/ow/$f" || fail "a refused build -o changed $f"
done
# A new .json or .safetensors in the model directory would be read by later builds.
expect_exit 2 "build -o MODEL/new.safetensors" -- "$KILN" build --model "$TMP/ow" -o "$TMP/ow/plan.safetensors"
expect_in "$TMP/err" "would be read as part of the checkpoint" "build -o MODEL/x.safetensors says why"
# A sharded checkpoint: its shards, and model.safetensors that does not exist yet (it would win
# over the index at the next build).
rm -rf "$TMP/sharded" && mkdir -p "$TMP/sharded/shards"
cp "$FIXTURES/t5-tiny/config.json" "$FIXTURES/t5-tiny/spiece.model" "$TMP/sharded/"
cp "$FIXTURES/t5-tiny/model.safetensors" "$TMP/sharded/shards/part-1.safetensors"
python3 - "$TMP/sharded" <<'PY' || fail "making the sharded checkpoint"
import json, struct, sys
d = sys.argv[1]
f = open(d + "/shards/part-1.safetensors", "rb")
h = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
h.pop("__metadata__", None)
json.dump({"weight_map": {name: "shards/part-1.safetensors" for name in h}},
          open(d + "/model.safetensors.index.json", "w"))
PY
check_input_o "-o a shard" "$TMP/sharded" "$TMP/sharded/shards/part-1.safetensors"
check_input_o "-o MODEL/model.safetensors of a sharded checkpoint" "$TMP/sharded" "$TMP/sharded/model.safetensors"
[ ! -e "$TMP/sharded/model.safetensors" ] || fail "a refused build wrote $TMP/sharded/model.safetensors"
# A plan beside the weights is fine.
expect_exit 0 "build -o MODEL/t5.plan" -- "$KILN" build --model "$TMP/sharded" -o "$TMP/sharded/t5.plan"
expect_exit 0 "run the plan built beside the shards" -- "$KILN" run --plan "$TMP/sharded/t5.plan" --prompt "reverse: abc"
rm -rf "$TMP/ow" "$TMP/owlink" "$TMP/hardlink.safetensors" "$TMP/sharded"

# --- a cuda plan where no GPU is: exit 1, naming the fix (issue 36, item 4) ---
# A CUDA build makes cuda plans without a GPU; a build without CUDA cannot (test_plan.cc's
# BadInputOtherDeviceIsRefused covers it with an edited plan).
if "$KILN" --version | grep -q "cuda: compiled in; no GPU visible"; then
  expect_exit 0 "build --device cuda without a GPU" -- "$KILN" build --model "$FIXTURES/t5-tiny" --device cuda -o "$TMP/cuda.plan"
  expect_exit 1 "run a cuda plan without a GPU" -- "$KILN" run --plan "$TMP/cuda.plan" --prompt "reverse: abc"
  expect_in "$TMP/err" "device cuda: no NVIDIA GPU/driver found (CUDA: " "says what is missing"
  expect_in "$TMP/err" "rebuild it with --device cpu" "names the fix"
fi

# --- the messages themselves (items 15, 16) ---
mkdir -p "$TMP/badcfg"
cp "$FIXTURES/t5-tiny/spiece.model" "$FIXTURES/t5-tiny/model.safetensors" "$TMP/badcfg/"
printf '{"model_type": "t5", ' > "$TMP/badcfg/config.json"
expect_exit 1 "config.json that is not JSON" -- "$KILN" build --model "$TMP/badcfg" -o "$TMP/x.plan"
expect_in "$TMP/err" "badcfg/config.json" "names the file"
if grep -qE 'json\.exception|\[src/|\.cc:[0-9]' "$TMP/err"; then fail "raw library text or a source location shown: $(cat "$TMP/err")"; fi
expect_exit 1 "-v keeps the details" -- "$KILN" -v build --model "$TMP/badcfg" -o "$TMP/x.plan"
expect_in "$TMP/err" "[src/" "-v shows the source location"
expect_in "$TMP/err" "json.exception" "-v shows the library's text"
for args in "run --plan $TMP/garbage.plan --prompt hi" "run --plan $TMP/short.plan --prompt copy:de --beams 99" "tokenize --plan $TMP/short.plan --decode --text x"; do
  # shellcheck disable=SC2086
  "$KILN" $args >/dev/null 2>"$TMP/err"
  if grep -qE '\[src/|\.cc:[0-9]' "$TMP/err"; then fail "source location in: $(cat "$TMP/err")"; fi
done
expect_exit 2 "--beam typo" -- "$KILN" run --plan "$TMP/short.plan" --prompt "copy: de" --beam 4
expect_in "$TMP/err" "kiln run: error: unknown option --beam (did you mean --beams?)" "suggests --beams"
expect_exit 2 "--max-new-token typo" -- "$KILN" eval --plan "$TMP/short.plan" --dataset "$TMP/long_ds.jsonl" --max-new-token=4
expect_in "$TMP/err" "kiln eval: error: unknown option --max-new-token (did you mean --max-new-tokens?)" "suggests --max-new-tokens"
expect_exit 2 "--verbsoe typo" -- "$KILN" tokenize --plan "$TMP/short.plan" --text hi --verbsoe
expect_in "$TMP/err" "did you mean --verbose?" "suggests a global flag too"
expect_exit 2 "missing value" -- "$KILN" run --plan "$TMP/short.plan" --prompt
expect_in "$TMP/err" "kiln run: error: --prompt needs a value" "says the value is missing"
expect_exit 2 "--plan twice" -- "$KILN" run --plan "$TMP/short.plan" --plan "$TMP/short.plan" --prompt hi
expect_in "$TMP/err" "kiln run: error: --plan was given 2 times; it takes one value" "says given twice"
expect_exit 2 "required option" -- "$KILN" eval --plan "$TMP/short.plan"
expect_in "$TMP/err" "kiln eval: error: --dataset is required" "names the option"
finish
