// kiln: compile HuggingFace transformer checkpoints into plans, run, evaluate and serve them.
#include <cstdio>
#include <map>

#include "backend/backend.h"
#include "commands.h"
#include "core/cpu_features.h"
#include "core/version.h"

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
  fmt::print("kiln {} (git {})\n", kiln::version_string(), kiln::git_revision());
  fmt::print("backends:\n  cpu: {}\n  cuda: {}\n", kiln::describe_cpu_features(), cuda_line);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "kiln: an inference compiler, runtime and server for transformer LLMs (T5/Flan-T5, BLOOM).\n"
      "Build a plan from a HuggingFace checkpoint, then run, evaluate, benchmark or serve it."};
  app.require_subcommand(0, 1);
  app.fallthrough();  // global flags (-v, -q, --threads) also work after the subcommand
  kiln::cli::GlobalOptions global;
  bool version = false;
  app.add_flag("--version", version, "print version, git revision and compiled-in backends");
  app.add_flag("-v,--verbose", global.verbose, "log what each step does (INFO level)");
  app.add_flag("-q,--quiet", global.quiet, "only errors");
  app.add_option("--threads", global.threads, "CPU threads (default: KILN_NUM_THREADS or all)")
      ->check(CLI::NonNegativeNumber);

  std::map<std::string, kiln::cli::Runner> runners;
  runners["build"] = kiln::cli::add_build(app);
  runners["run"] = kiln::cli::add_run(app);
  runners["eval"] = kiln::cli::add_eval(app);
  runners["bench"] = kiln::cli::add_bench(app);
  runners["inspect"] = kiln::cli::add_inspect(app);
  runners["serve"] = (kiln::cli::add_planned(
      app, "serve",
      "Serve a Triton-style model repository over KServe v2 HTTP/gRPC and OpenAI endpoints.",
      "kiln serve --model-repository DIR [--http-port 8000] [--grpc-port 8001] "
      "[--metrics-port 8002]"));
  runners["tokenize"] = kiln::cli::add_tokenize(app);
  runners["synth"] = kiln::cli::add_synth(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  if (version) {
    print_version();
    return 0;
  }
  for (CLI::App* sub : app.get_subcommands()) {
    try {
      return runners.at(sub->get_name())(global);
    } catch (const kiln::Error& e) {
      fmt::print(stderr, "kiln {}: error: {}\n", sub->get_name(), e.what());
      return e.kind() == kiln::ErrorKind::kUsage ? 2 : 1;
    } catch (const std::exception& e) {
      fmt::print(stderr, "kiln {}: error: {}\n", sub->get_name(), e.what());
      return 1;
    }
  }
  fmt::print("{}", app.help());
  return 2;
}
