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
Runner add_run(CLI::App& app);
Runner add_eval(CLI::App& app);
Runner add_inspect(CLI::App& app);
Runner add_synth(CLI::App& app);
Runner add_bench(CLI::App& app);
// Subcommands of DESIGN.md that are not built yet: --help describes them, running exits 2.
Runner add_planned(CLI::App& app, const std::string& name, const std::string& description,
                   const std::string& usage);

// --- shared helpers (common.cc) ---
std::unique_ptr<Context> make_context(const GlobalOptions& g);
// From --plan or --model (exactly one must be set).
std::unique_ptr<CompiledModel> open_engine(Context& ctx, const std::string& plan,
                                           const std::string& model);
// JSON lines: each line a string, or an object with "text" or "prompt". Errors name file:line.
std::vector<std::string> read_prompt_lines(const std::string& path);
// Generation flags shared by run/eval.
struct GenerationFlags {
  int64_t max_new_tokens = 16;
  int beams = 1;
  double length_penalty = 1.0;
  std::string early_stopping = "false";  // HF's spelling: false (its default), true, never
  float temperature = 0.0f;              // 0: greedy
  int top_k = 0;
  float top_p = 1.0f;
  uint64_t seed = 0;
  int batch_size = 8;
  std::string prompt_template;  // empty: the plan's
  // Which generation flags the user gave: only those override the model's generation_config.
  std::vector<std::pair<std::string, CLI::Option*>> given;
  bool was_given(const std::string& flag) const;
};
void add_generation_flags(CLI::App& cmd, GenerationFlags& flags);
// The model's defaults (HF's, with its generation_config.json applied), then the flags given.
GenerationParams to_params(const GenerationFlags& flags, const ModelDesc& desc);
// Generates for every prompt in batches of flags.batch_size; results in prompt order.
struct Generated {
  std::string prompt;  // as given (before the template)
  std::vector<int64_t> input_ids;
  GenerationResult result;
  std::string text;
};
std::vector<Generated> generate_all(CompiledModel& engine, const std::vector<std::string>& prompts,
                                    const GenerationFlags& flags, bool show_progress);

}  // namespace kiln::cli
