// kiln: compile HuggingFace transformer checkpoints into plans; run, evaluate, benchmark and
// inspect them.
#include <cstdio>
#include <map>

#include "backend/backend.h"
#include "commands.h"
#include "core/cpu_features.h"
#include "core/version.h"
#include "output.h"

namespace {

void print_version() {
  const kiln::CudaInfo cuda = kiln::query_cuda();
  std::string cuda_line;
  if (!cuda.compiled)
    cuda_line = "no (built without CUDA)";
  else if (cuda.device_count == 0)
    cuda_line = "compiled in; no GPU visible (" + cuda.error + ")";
  else
    cuda_line =
        fmt::format("compiled in; {} GPU(s), device 0: {}", cuda.device_count, cuda.first_device);
  kiln::cli::out("kiln {} (git {})\n", kiln::version_string(), kiln::git_revision());
  kiln::cli::out("backends:\n  cpu: {}\n  cuda: {}\n", kiln::describe_cpu_features(), cuda_line);
}

// What a user reads: the message without library-internal text (nlohmann's
// "[json.exception.parse_error.101] " tags). -v keeps everything, with the source location.
std::string user_message(std::string text) {
  for (size_t pos; (pos = text.find("[json.exception.")) != std::string::npos;) {
    size_t end = text.find(']', pos);
    if (end == std::string::npos) break;
    ++end;
    if (end < text.size() && text[end] == ' ') ++end;
    text.erase(pos, end - pos);
  }
  return text;
}

// CLI11's wording for the common cases, in kiln's.
std::string parser_message(const std::string& what) {
  const size_t colon = what.find(": ");
  const std::string option = colon == std::string::npos ? "" : what.substr(0, colon);
  const std::string rest = colon == std::string::npos ? "" : what.substr(colon + 2);
  if (rest.starts_with("1 required ") && rest.ends_with(" missing"))
    return option + " needs a value";
  static constexpr std::string_view kTwice = "At Most 1 required but received ";
  if (rest.starts_with(kTwice))
    return fmt::format("{} was given {} times; it takes one value", option,
                       rest.substr(kTwice.size()));
  if (option == "Could not convert") {
    const size_t eq = rest.find(" = ");
    if (eq != std::string::npos)
      return fmt::format("{}: '{}' is not a valid value", rest.substr(0, eq), rest.substr(eq + 3));
  }
  return what;
}

std::vector<std::string> option_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::Option* opt : app.get_options()) {
    for (const std::string& l : opt->get_lnames()) names.push_back("--" + l);
    for (const std::string& s : opt->get_snames()) names.push_back("-" + s);
  }
  return names;
}

std::vector<std::string> command_names(const CLI::App& app) {
  std::vector<std::string> names;
  for (const CLI::App* sub : app.get_subcommands([](const CLI::App*) { return true; }))
    names.push_back(sub->get_name());
  return names;
}

int usage_error(const std::string& who, const std::string& message) {
  kiln::cli::err("{}: error: {}\nRun '{} --help' for usage.\n", who, message, who);
  return 2;
}

// An argument the parser did not take: an unknown option (with the closest known one), an
// unknown command (with the list), or a stray value (an option takes exactly one value).
int extras_error(CLI::App& app, CLI::App* sub, const std::string& who) {
  std::vector<std::string> extras = app.remaining(true);
  if (extras.empty()) return usage_error(who, "unexpected arguments");
  if (sub == nullptr) {
    for (const std::string& e : extras) {
      if (e.starts_with("-")) continue;
      const std::vector<std::string> commands = command_names(app);
      const std::string guess = kiln::cli::closest_name(e, commands);
      return usage_error(who, fmt::format("unknown command '{}'{}; the commands are: {}", e,
                                          guess.empty() ? "" : " (did you mean " + guess + "?)",
                                          fmt::join(commands, ", ")));
    }
  }
  for (const std::string& e : extras) {
    if (e.size() < 2 || e[0] != '-') continue;
    const std::string name = e.substr(0, e.find('='));
    std::vector<std::string> names = option_names(app);
    if (sub != nullptr) {
      const std::vector<std::string> own = option_names(*sub);
      names.insert(names.end(), own.begin(), own.end());
    }
    const std::string guess = kiln::cli::closest_name(name, names);
    return usage_error(who, fmt::format("unknown option {}{}", name,
                                        guess.empty() ? "" : " (did you mean " + guess + "?)"));
  }
  // A second value for a positional argument (`kiln inspect a.plan b.plan`, `kiln help run build`).
  if (sub != nullptr) {
    for (const CLI::Option* opt : sub->get_options()) {
      if (!opt->get_positional() || opt->count() == 0) continue;
      const std::string given = opt->as<std::string>();
      return usage_error(who, fmt::format("unexpected argument '{}': {} takes one {} ('{}' was "
                                          "given first); give one per call",
                                          extras[0], who, opt->get_name(), given));
    }
  }
  // A value with spaces that was not quoted: show it with an option this command has.
  std::string example;
  for (const char* flag : {"--prompt", "--text"})
    if (sub != nullptr && example.empty() && sub->get_option_no_throw(flag) != nullptr)
      example = fmt::format(" ({} \"reverse: abc\")", flag);
  return usage_error(who, fmt::format("unexpected argument '{}': each option takes exactly one "
                                      "value; quote a value that contains spaces{}",
                                      extras[0], example));
}

bool wants_verbose(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::string_view(argv[i]) == "-v" || std::string_view(argv[i]) == "--verbose") return true;
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  kiln::cli::ignore_write_signals();
  CLI::App app{
      "kiln compiles HuggingFace transformer checkpoints (T5/Flan-T5, BLOOM) into plans and runs\n"
      "them: build a plan from a checkpoint, then run, evaluate, benchmark, inspect or serve it\n"
      "(KServe v2 HTTP/gRPC as Triton speaks it, and the OpenAI API: `kiln serve --help`).\n"
      "Examples:\n"
      "  kiln build --model models/t5-tiny -o t5.plan\n"
      "  kiln run --plan t5.plan --prompt \"reverse: suvogi\"\n"
      "  kiln help run",
      "kiln"};
  app.require_subcommand(0, 1);
  app.fallthrough();   // global flags (-v, -q, --threads) also work after the subcommand
  app.allow_extras();  // reported by extras_error(), with suggestions
  app.footer(
      "Exit codes: 0 ok, 1 runtime error (a missing or unreadable file, a damaged plan), 2 usage\n"
      "error (a bad flag, or a bad prompt/row in an input file).");
  kiln::cli::GlobalOptions global;
  bool version = false;
  app.add_flag("--version", version, "print version, git revision and compiled-in backends");
  app.add_flag("-v,--verbose", global.verbose,
               "log what each step does (INFO level), and source locations of errors");
  app.add_flag("-q,--quiet", global.quiet, "only errors (no warnings, no progress)");
  kiln::cli::in_range(
      app.add_option("--threads", global.threads,
                     "CPU threads (default: KILN_NUM_THREADS, else one per hardware thread)"),
      1, kiln::cli::max_threads());

  std::map<std::string, kiln::cli::Runner> runners;
  runners["build"] = kiln::cli::add_build(app);
  runners["calibrate"] = kiln::cli::add_calibrate(app);
  runners["run"] = kiln::cli::add_run(app);
  runners["eval"] = kiln::cli::add_eval(app);
  runners["bench"] = kiln::cli::add_bench(app);
  runners["perf"] = kiln::cli::add_perf(app);
  runners["inspect"] = kiln::cli::add_inspect(app);
  runners["exec"] = kiln::cli::add_exec(app);
  runners["serve"] = kiln::cli::add_serve(app);
  runners["tokenize"] = kiln::cli::add_tokenize(app);
  runners["synth"] = kiln::cli::add_synth(app);
  std::string help_topic;
  CLI::App* help =
      app.add_subcommand("help", "Show a command's help: `kiln help run` is `kiln run --help`");
  help->add_option("command", help_topic, "the command");
  runners["help"] = [&](const kiln::cli::GlobalOptions&) {
    if (help_topic.empty()) {
      // app.help() would show the selected subcommand's (this one's) help.
      kiln::cli::out_text(app.get_formatter()->make_help(&app, "kiln", CLI::AppFormatMode::Normal));
      return 0;
    }
    const std::vector<std::string> commands = command_names(app);
    if (std::find(commands.begin(), commands.end(), help_topic) == commands.end())
      return usage_error("kiln", fmt::format("unknown command '{}'; the commands are: {}",
                                             help_topic, fmt::join(commands, ", ")));
    kiln::cli::out_text(app.get_subcommand(help_topic)->help("kiln"));
    return 0;
  };

  const bool verbose = wants_verbose(argc, argv);
  try {
    try {
      app.parse(argc, argv);
    } catch (const CLI::ParseError& e) {
      const std::vector<CLI::App*> subs = app.get_subcommands();
      CLI::App* sub = subs.empty() ? nullptr : subs[0];
      const std::string who = sub == nullptr ? "kiln" : "kiln " + sub->get_name();
      if (dynamic_cast<const CLI::CallForHelp*>(&e) != nullptr) {
        kiln::cli::out_text(app.help());  // the selected subcommand's help, if any
        return 0;
      }
      if (dynamic_cast<const CLI::CallForAllHelp*>(&e) != nullptr) {
        kiln::cli::out_text(app.help("", CLI::AppFormatMode::All));
        return 0;
      }
      if (e.get_exit_code() == static_cast<int>(CLI::ExitCodes::Success)) {
        app.exit(e);
        kiln::cli::check_cout();
        return 0;
      }
      return usage_error(who, parser_message(e.what()));
    }
    const std::vector<CLI::App*> subs = app.get_subcommands();
    CLI::App* sub = subs.empty() ? nullptr : subs[0];
    if (!app.remaining(true).empty())
      return extras_error(app, sub, sub == nullptr ? "kiln" : "kiln " + sub->get_name());
    if (version) {
      print_version();
      return 0;
    }
    if (global.verbose && global.quiet)
      kiln::Logger().warn("-v and -q were both given: -v wins (INFO logging)");
    if (sub == nullptr) {
      kiln::cli::err("kiln: error: no command given\n\n{}", app.help());
      return 2;
    }
    const std::string who = "kiln " + sub->get_name();
    try {
      return runners.at(sub->get_name())(global);
    } catch (const kiln::Error& e) {
      kiln::cli::err("{}: error: {}{}\n", who, verbose ? e.what() : user_message(e.what()),
                     verbose ? " [" + e.where() + "]" : "");
      return e.kind() == kiln::ErrorKind::kUsage ? 2 : 1;
    } catch (const std::bad_alloc&) {
      kiln::cli::err("{}: error: out of memory\n", who);
      return 1;
    } catch (const std::exception& e) {
      kiln::cli::err("{}: error: {}\n", who, verbose ? e.what() : user_message(e.what()));
      return 1;
    }
  } catch (const kiln::cli::StdoutClosed&) {
    return 0;  // the reader went away (`| head -1`): nothing more to say to anyone
  } catch (const kiln::Error& e) {
    // Only writing to standard output fails outside a command (--help, --version, help).
    kiln::cli::err("kiln: error: {}\n", e.what());
    return 1;
  }
}
