// Subcommands of the kiln CLI. Each registers its options on the app and returns the function
// that runs it after parsing; the runner returns the process exit code.
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "builder/builder.h"
#include "core/context.h"
#include "kiln/generate.h"
#include "runtime/compiled_model.h"

namespace kiln::cli {

struct GlobalOptions {
  bool verbose = false;
  bool quiet = false;
  int threads = 0;
};

using Runner = std::function<int(const GlobalOptions&)>;

Runner add_tokenize(CLI::App& app);
Runner add_build(CLI::App& app);
Runner add_calibrate(CLI::App& app);
Runner add_run(CLI::App& app);
Runner add_eval(CLI::App& app);
Runner add_inspect(CLI::App& app);
Runner add_synth(CLI::App& app);
Runner add_bench(CLI::App& app);
Runner add_perf(CLI::App& app);
Runner add_serve(CLI::App& app);
Runner add_exec(CLI::App& app);
// `kiln inspect --onnx FILE [--json]` (inspect_onnx.cc).
int inspect_onnx(const std::string& path, bool json);

// --- options (common.cc) ---
// An option that takes exactly one value per occurrence, kept as given: "[3, 1, 2]" or "a,b" is
// one value, never a list; repeatable options collect one value per occurrence.
CLI::Option* one_value(CLI::Option* opt);
// Limits shown in --help and checked by the parser ("--beams: Value 40 not in range [1 - 32]").
CLI::Option* in_range(CLI::Option* opt, int64_t lo, int64_t hi);
// Validators: a floating-point value for which ok() holds ("must be a number in 0..100, got
// abc"), and an integer in lo..hi (--help: "INT:in 1..32", or ">= lo" when hi is the maximum).
CLI::Validator number_check(std::function<bool(double)> ok, const std::string& rule);
CLI::Validator int_check(int64_t lo, int64_t hi);
// A subcommand's --help after its options: `details` (what it does, examples), then the global
// flags and the exit codes.
void describe(CLI::App* cmd, const std::string& details);
int max_threads();  // --threads upper limit: this machine's hardware threads
// The closest of `names` to `given` (edit distance, or a prefix of it), or "" when none is close
// enough to be a likely typo: the "did you mean ...?" of unknown options, commands and presets
// (suggest.cc).
std::string closest_name(const std::string& given, const std::vector<std::string>& names);

// --- shared helpers (common.cc) ---
std::unique_ptr<Context> make_context(const GlobalOptions& g);
// From --plan or --model (exactly one must be set); shows activity on a terminal while it builds.
std::unique_ptr<CompiledModel> open_engine(Context& ctx, const std::string& plan,
                                           const std::string& model);
// Up-front checks of path arguments, naming the flag: a missing path, or a directory given to
// --plan (like --input DIR), is a runtime error (exit 1); a file given to --model is a usage error
// that says what to give instead.
void check_model_dir(const std::string& path, const char* flag);
void check_plan_file(const std::string& path, const char* flag);
// A file argument (--onnx, --inputs, --compare): missing or a directory is a runtime error
// (exit 1) naming the flag and the path.
void check_input_file(const std::string& path, const char* flag);

// --- inputs (inputs.cc) ---
// A prompt or text with where it came from, for errors: "--prompt 2" or "prompts.jsonl:3".
struct TextInput {
  std::string text;
  std::string origin;
};
// One TextInput per occurrence of `flag`.
std::vector<TextInput> inputs_from_flag(const std::vector<std::string>& values,
                                        const std::string& flag);
// JSON lines: each line a string, or an object with "text" or "prompt"; "-" reads standard
// input. Errors name file:line.
std::vector<TextInput> read_prompt_lines(const std::string& path, const char* flag);
// Refuses invalid UTF-8 (naming the origin and byte offset) and, unless allowed, empty text.
void check_text(const TextInput& input, bool allow_empty);
// read_jsonl, with "-" meaning standard input (named "<stdin>" in errors). `flag` names the
// option in errors about the path itself (missing: exit 1; a directory: exit 1).
void read_jsonl_arg(const std::string& path, const char* flag,
                    const std::function<void(const nlohmann::json&, int)>& fn);
// How an input file argument is named in errors: the path, or "<stdin>" for "-".
std::string input_name(const std::string& path);

// --- generation (generate.cc) ---
struct GenerationFlags {
  int64_t max_new_tokens = 16;
  int beams = 1;
  double length_penalty = 1.0;
  std::string early_stopping = "false";  // HF's spelling: false (its default), true, never
  float temperature = 0.0f;              // 0: greedy
  int64_t top_k = 0;
  float top_p = 1.0f;
  int64_t seed = 0;
  int64_t min_new_tokens = 0;
  int64_t min_length = 0;
  float repetition_penalty = 1.0f;
  int64_t no_repeat_ngram_size = 0;
  int64_t encoder_no_repeat_ngram_size = 0;
  std::string bad_words_ids;    // JSON: [[id, ...], ...]
  std::string suppress_tokens;  // JSON: [id, ...]
  int64_t forced_bos_token_id = 0;
  std::string forced_eos_token_id;  // JSON: id or [id, ...]
  int batch_size = 8;
  std::string prompt_template;  // empty: the plan's
  // Which generation flags the user gave: only those override the model's generation_config.
  std::vector<std::pair<std::string, CLI::Option*>> given;
  bool was_given(const std::string& flag) const;
};
void add_generation_flags(CLI::App& cmd, GenerationFlags& flags);
// The model's defaults (HF's, with its generation_config.json applied), then the flags given.
// Warns (through `log`) about flags that have no effect with the resulting parameters.
GenerationParams to_params(const GenerationFlags& flags, const ModelDesc& desc, const Logger& log);
// The seed the run's sampled requests derive theirs from: --seed, else one from the system's
// entropy (logged at INFO with how to repeat the run). Request i samples from
// derive_seed(base, i): identical prompts differ, and the same base repeats the run exactly.
uint64_t run_seed(const GenerationFlags& flags, const GenerationParams& params, const Logger& log);
struct Generated {
  std::string prompt;  // as given (before the template)
  std::vector<int64_t> input_ids;
  GenerationResult result;
  std::string text;
};
// Called for each prompt as soon as it and every prompt before it are done (prompt order), with
// the progress line (to hide while printing to the same terminal); returns a note for the
// progress line ("" for none).
using OnGenerated = std::function<std::string(size_t index, const Generated&, Progress&)>;
// Generates for every prompt (up to flags.batch_size in flight) with a progress line on a
// terminal. Every prompt is checked (UTF-8, empty, length) before anything is generated, errors
// naming its origin. `model_dir`: the --model directory the model was built from in memory, or
// "" for a plan (a decoder-only checkpoint run without a template gets a warning).
std::vector<Generated> generate_all(CompiledModel& engine, const std::vector<TextInput>& prompts,
                                    const GenerationFlags& flags, const std::string& model_dir,
                                    const OnGenerated& on_generated);
// The text of generated ids as HF's decode gives it (ids the tokenizer has no token for are
// left out); warns once per call naming such ids and `origin`.
std::string decode_ids(const Tokenizer& tok, const std::vector<int64_t>& ids,
                       const std::string& origin, const Logger& log);

}  // namespace kiln::cli
