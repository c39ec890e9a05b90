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

void check_input_file(const std::string& path, const char* flag) {
  KILN_CHECK_USAGE(!path.empty(), "{}: the path is empty", flag);
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (!fs::exists(st)) KILN_FAIL_KIND(ErrorKind::kNotFound, "{} {}: no such file", flag, path);
  KILN_CHECK(!fs::is_directory(st), "{} {}: this is a directory; {} takes a file", flag, path,
             flag);
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

}  // namespace kiln::cli
