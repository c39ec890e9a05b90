// Options, context and model opening shared by the subcommands.
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <thread>

#include "commands.h"
#include "plan/plan.h"
#include "runtime/scheduler.h"

namespace kiln::cli {
namespace fs = std::filesystem;
namespace {

// A validator over a floating-point value ("must be a number in 0..100, got abc").
CLI::Validator number_check(std::function<bool(double)> ok, const std::string& rule) {
  return CLI::Validator(
      [ok, rule](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (end != text.c_str() && *end == '\0' && ok(v)) return {};
        return "must be " + rule + ", got " + text;
      },
      rule);
}

// Integer limits as --help shows them ("INT in 1..32", "INT >= 0") and errors say them.
CLI::Validator int_check(int64_t lo, int64_t hi) {
  const std::string rule = hi == std::numeric_limits<int64_t>::max()
                               ? fmt::format(">= {}", lo)
                               : fmt::format("in {}..{}", lo, hi);
  // --help shows "INT:in 1..32" (CLI11 puts the type before the validator's description).
  return CLI::Validator(
      [lo, hi, rule](std::string& text) -> std::string {
        char* end = nullptr;
        errno = 0;
        const long long v = std::strtoll(text.c_str(), &end, 10);
        if (end == text.c_str() || *end != '\0')
          return "must be an integer " + rule + ", got " + text;
        if (errno == ERANGE || v < lo || v > hi) return "must be " + rule + ", got " + text;
        return {};
      },
      rule);
}

}  // namespace

CLI::Option* one_value(CLI::Option* opt) {
  // CLI11 otherwise splits a value that looks like a list ("[3, 1, 2]" → three values) and lets
  // one occurrence swallow the following words.
  return opt->expected(1)->allow_extra_args(false)->delimiter('\0')->multi_option_policy(
      CLI::MultiOptionPolicy::TakeAll);
}

CLI::Option* in_range(CLI::Option* opt, int64_t lo, int64_t hi) {
  return opt->check(int_check(lo, hi));
}

int max_threads() {
  const unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

void describe(CLI::App* cmd, const std::string& details) {
  cmd->footer(
      details + "\n\n" +
      fmt::format(
          "Global flags (before or after the command):\n"
          "  -v, --verbose     log what each step does (INFO), and source locations of errors\n"
          "  -q, --quiet       only errors (no warnings, no progress)\n"
          "  --threads N       CPU threads, 1..{} (this machine's hardware threads; default:\n"
          "                    KILN_NUM_THREADS, else all of them)\n"
          "Exit codes: 0 ok, 1 runtime error (a missing or unreadable file, a damaged plan), 2 "
          "usage\n"
          "error (a bad flag, or a bad prompt/row in an input file).",
          max_threads()));
}

std::unique_ptr<Context> make_context(const GlobalOptions& g) {
  ContextOptions o;
  o.threads = g.threads;
  o.log_level = g.verbose ? LogLevel::kInfo : (g.quiet ? LogLevel::kError : LogLevel::kWarning);
  o = options_from_environment(o);
  // Flags win over KILN_LOG_LEVEL; -v wins over -q (main warns about the pair).
  if (g.verbose)
    o.log_level = LogLevel::kInfo;
  else if (g.quiet)
    o.log_level = LogLevel::kError;
  KILN_CHECK_USAGE(o.threads <= max_threads(),
                   "KILN_NUM_THREADS={}: this machine has {} hardware threads; give 1..{}",
                   o.threads, max_threads(), max_threads());
  return std::make_unique<Context>(o);
}

namespace {

bool starts_with_plan_magic(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  char magic[sizeof(kPlanMagic)] = {};
  in.read(magic, sizeof magic);
  return in.gcount() == sizeof magic && std::equal(magic, magic + sizeof magic, kPlanMagic);
}

}  // namespace

void check_model_dir(const std::string& path, const char* flag) {
  KILN_CHECK_USAGE(!path.empty(), "{}: the path is empty", flag);
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) KILN_FAIL_KIND(ErrorKind::kNotFound, "{} {}: no such directory", flag, path);
  if (fs::is_directory(st)) return;
  KILN_CHECK_USAGE(!starts_with_plan_magic(path),
                   "{} {}: this is a kiln plan, not a checkpoint directory; use --plan {}", flag,
                   path, path);
  const std::string parent = fs::path(path).parent_path().string();
  KILN_FAIL_KIND(ErrorKind::kUsage,
                 "{} {}: this is a file; {} takes a HuggingFace checkpoint directory (with "
                 "config.json, model.safetensors and the tokenizer){}",
                 flag, path, flag, parent.empty() ? "" : fmt::format(", e.g. {} {}", flag, parent));
}

void check_plan_file(const std::string& path, const char* flag) {
  KILN_CHECK_USAGE(!path.empty(), "{}: the path is empty", flag);
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) KILN_FAIL_KIND(ErrorKind::kNotFound, "{} {}: no such file", flag, path);
  if (fs::is_directory(st)) {
    // A runtime error like --input DIR and --dataset DIR: a path that cannot be read as a file.
    const bool checkpoint = fs::exists(fs::path(path) / "config.json", ec);
    KILN_FAIL("{} {}: this is a directory; a plan is the file `kiln build` writes{}", flag, path,
              checkpoint ? fmt::format(" (for a checkpoint directory use --model {})", path) : "");
  }
}

std::unique_ptr<CompiledModel> open_engine(Context& ctx, const std::string& plan,
                                           const std::string& model) {
  KILN_CHECK_USAGE(plan.empty() != model.empty(), "give exactly one of --plan or --model");
  if (!plan.empty()) {
    check_plan_file(plan, "--plan");
    Activity activity(ctx.log(), "loading " + plan);
    return CompiledModel::load_plan(ctx, plan);
  }
  check_model_dir(model, "--model");
  Activity activity(ctx.log(), "building " + model + " in memory (import, passes)");
  return compile_model_dir(ctx, model);
}

bool GenerationFlags::was_given(const std::string& flag) const {
  for (const auto& [name, opt] : given)
    if (name == flag) return opt->count() > 0;
  return false;
}

void add_generation_flags(CLI::App& cmd, GenerationFlags& f) {
  auto track = [&](const char* name, CLI::Option* opt) { f.given.emplace_back(name, opt); };
  track("--max-new-tokens",
        in_range(cmd.add_option("--max-new-tokens", f.max_new_tokens,
                                "most tokens to generate per prompt (default: the model's "
                                "generation_config, else this)")
                     ->capture_default_str(),
                 1, kMaxNewTokensLimit));
  track("--beams", in_range(cmd.add_option("--beams", f.beams,
                                           "beam search width (1: greedy or sampling; default: "
                                           "the model's)")
                                ->capture_default_str(),
                            1, kMaxBeams));
  track("--length-penalty",
        cmd.add_option("--length-penalty", f.length_penalty,
                       "with --beams: beam score = log p / length^penalty (HF semantics)")
            ->capture_default_str()
            ->check(number_check([](double v) { return std::isfinite(v); }, "a finite number")));
  track("--early-stopping",
        cmd.add_option("--early-stopping", f.early_stopping,
                       "with --beams: when beam search stops, in HF's spelling: false (once no "
                       "running beam can beat the finished ones at its current length), true "
                       "(once --beams hypotheses finished), never (once no running beam can beat "
                       "them at any length); default: the model's, else false")
            ->check(CLI::IsMember({"false", "true", "never"})));
  track("--temperature", cmd.add_option("--temperature", f.temperature,
                                        "sample with this temperature (0: greedy, the default)")
                             ->check(number_check([](double v) { return v >= 0.0 && v <= 100.0; },
                                                  "a number in 0..100")));
  track("--top-k", cmd.add_option("--top-k", f.top_k,
                                  "when sampling: only the k most likely tokens (0: off; HF's "
                                  "default when sampling: 50)")
                       ->check(int_check(0, std::numeric_limits<int64_t>::max())));
  track("--top-p", cmd.add_option("--top-p", f.top_p,
                                  "when sampling: the smallest set of tokens with this mass (1: "
                                  "off)")
                       ->check(number_check([](double v) { return v > 0.0 && v <= 1.0; },
                                            "a number in (0, 1]")));
  track("--seed",
        cmd.add_option("--seed", f.seed, "when sampling: the random seed (same seed, same output)")
            ->check(int_check(0, std::numeric_limits<int64_t>::max())));
  in_range(cmd.add_option("--batch-size", f.batch_size,
                          "prompts in flight together; a new one joins as soon as one finishes")
               ->capture_default_str(),
           1, 1024);
  cmd.add_option("--prompt-template", f.prompt_template,
                 "wrap each prompt: every {prompt} is replaced by it, e.g. \"{prompt} =\" "
                 "(default: the plan's)");
}

GenerationParams to_params(const GenerationFlags& f, const ModelDesc& desc, const Logger& log) {
  GenerationParams p = default_generation_params(desc);
  const bool model_sets_length = desc.generation.max_new_tokens || desc.generation.max_length;
  if (f.was_given("--max-new-tokens") || !model_sets_length) {
    p.max_new_tokens = f.max_new_tokens;
    p.max_length = 0;
  }
  if (f.was_given("--beams")) p.num_beams = f.beams;
  if (f.was_given("--length-penalty")) p.length_penalty = f.length_penalty;
  if (f.was_given("--early-stopping")) {
    p.early_stopping = f.early_stopping == "true"    ? EarlyStopping::kAlways
                       : f.early_stopping == "never" ? EarlyStopping::kNever
                                                     : EarlyStopping::kHeuristic;
  }
  if (f.was_given("--temperature")) {
    p.do_sample = f.temperature > 0.0f;
    if (p.do_sample) p.temperature = f.temperature;
  }
  if (f.was_given("--top-k"))
    p.top_k = static_cast<int>(std::min<int64_t>(f.top_k, std::numeric_limits<int>::max()));
  if (f.was_given("--top-p")) p.top_p = f.top_p;
  if (f.was_given("--seed")) p.seed = static_cast<uint64_t>(f.seed);
  // Flags that the resulting decoding strategy ignores: say so instead of ignoring silently.
  if (!p.do_sample)
    for (const char* flag : {"--top-k", "--top-p", "--seed"})
      if (f.was_given(flag))
        log.warn("{} has no effect without sampling (give --temperature > 0)", flag);
  if (p.num_beams == 1)
    for (const char* flag : {"--length-penalty", "--early-stopping"})
      if (f.was_given(flag)) log.warn("{} has no effect without beam search (--beams > 1)", flag);
  validate(p);
  return p;
}

}  // namespace kiln::cli
