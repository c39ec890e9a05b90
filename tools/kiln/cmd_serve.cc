// kiln serve: a Triton-compatible server (model repository, KServe v2 HTTP and gRPC, OpenAI API,
// Prometheus metrics) around the runtime's executors.
#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <filesystem>
#include <fstream>
#include <thread>

#include "commands.h"
#include "output.h"
#include "server/errors.h"
#include "server/grpc_frontend.h"
#include "server/http_frontend.h"
#include "server/metrics_http.h"
#include "server/model_manager.h"
#include "server/model_repository.h"
#include "server/request_log.h"

namespace kiln::cli {

namespace {

struct ServeOptions {
  std::string repository, plan, name, host = "127.0.0.1", control_mode = "none";
  std::vector<std::string> load_models;
  int http_port = 8000, grpc_port = 8001, metrics_port = 8002;
  std::string api_key_file, request_log;
  int64_t max_body_bytes = 16 << 20;
  double drain_timeout = 30.0;
  int http_threads = 128;
  // --plan only (a repository model sets these in its config.pbtxt).
  std::string prompt_template;
  int max_batch = 0, instances = 1;
  int64_t max_queue = -1, kv_budget_blocks = 0, default_max_tokens = 0;
};

int g_stop_pipe[2] = {-1, -1};

extern "C" void on_stop_signal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  [[maybe_unused]] ssize_t n = write(g_stop_pipe[1], &b, 1);  // async-signal-safe
}

void install_stop_handler() {
  KILN_CHECK(pipe2(g_stop_pipe, O_CLOEXEC | O_NONBLOCK) == 0, "cannot create a pipe: {}",
             std::strerror(errno));
  fcntl(g_stop_pipe[0], F_SETFL, fcntl(g_stop_pipe[0], F_GETFL) & ~O_NONBLOCK);
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);  // a client gone mid-write is an error return, not a signal
}

// Blocks until SIGTERM or SIGINT; returns which.
int wait_for_stop_signal() {
  unsigned char b = 0;
  while (read(g_stop_pipe[0], &b, 1) != 1) {
    if (errno != EINTR) return SIGTERM;
  }
  return b;
}

std::string read_api_key(const std::string& path) {
  std::ifstream in(path);
  KILN_CHECK(in.good(), "--api-key-file {}: cannot read it", path);
  std::string key;
  std::getline(in, key);
  while (!key.empty() && (key.back() == '\r' || key.back() == ' ')) key.pop_back();
  KILN_CHECK_USAGE(!key.empty(), "--api-key-file {}: the first line (the key) is empty", path);
  return key;
}

}  // namespace

Runner add_serve(CLI::App& app) {
  auto o = std::make_shared<ServeOptions>();
  CLI::App* cmd = app.add_subcommand(
      "serve", "Serve plans over KServe v2 HTTP/gRPC (Triton-compatible) and the OpenAI API");
  describe(cmd,
           "A model repository is Triton's layout: <repo>/<model>/config.pbtxt and\n"
           "<repo>/<model>/<version>/model.plan (platform: \"kiln_plan\"). Requests join the\n"
           "running batch at every step (continuous batching). SIGTERM/SIGINT: stop taking\n"
           "requests, finish those in flight (up to --drain-timeout), exit 0.\n"
           "Endpoints: /v2/health/{live,ready}, /v2/models/M[/versions/V][/ready|/config|/stats|\n"
           "/infer|/generate|/generate_stream], /v2/repository/..., /v1/models,\n"
           "/v1/completions, /v1/chat/completions; gRPC inference.GRPCInferenceService;\n"
           "GET /metrics on the metrics port. Ports 0: any free port (printed at start).\n"
           "Examples (each serves until Ctrl-C or SIGTERM):\n"
           "  kiln serve --model-repository repo\n"
           "  kiln serve --plan bloom.plan --name bloom --prompt-template \"{prompt} =\"\n"
           "  curl localhost:8000/v2/models/bloom/generate -d '{\"text_input\": \"add: 4 + 5\"}'\n"
           "See docs/serving.md.");
  cmd->add_option("--model-repository", o->repository, "Triton-layout model repository");
  cmd->add_option("--plan", o->plan, "serve one plan file without a repository");
  cmd->add_option("--name", o->name, "--plan: the model's name (default: the file's stem)");
  cmd->add_option("--host", o->host, "address to bind (default 127.0.0.1: this machine only)");
  in_range(cmd->add_option("--http-port", o->http_port, "KServe v2 + OpenAI HTTP port (8000)"), 0,
           65535);
  in_range(cmd->add_option("--grpc-port", o->grpc_port, "KServe v2 gRPC port (8001; -1: off)"), -1,
           65535);
  in_range(
      cmd->add_option("--metrics-port", o->metrics_port, "Prometheus metrics port (8002; -1: off)"),
      -1, 65535);
  cmd->add_option("--model-control-mode", o->control_mode,
                  "none: load every model at start; explicit: only --load-model ones and the "
                  "repository API's loads")
      ->check(CLI::IsMember({"none", "explicit"}));
  one_value(cmd->add_option("--load-model", o->load_models,
                            "explicit mode: load this model at start (repeatable)"));
  cmd->add_option("--api-key-file", o->api_key_file,
                  "require 'Authorization: Bearer <key>' (the file's first line) on every "
                  "request but health and metrics");
  cmd->add_option("--request-log", o->request_log,
                  "append one JSON line per finished request (model, tokens, queue/TTFT/total "
                  "ms, finish reason)");
  in_range(cmd->add_option("--max-body-bytes", o->max_body_bytes,
                           "largest request body accepted (16 MiB); larger: 413"),
           1024, int64_t{1} << 31);
  cmd->add_option("--drain-timeout", o->drain_timeout,
                  "seconds to let in-flight requests finish on SIGTERM (30)")
      ->check(number_check([](double v) { return v >= 0 && v <= 3600; }, "in 0..3600"));
  in_range(cmd->add_option("--http-threads", o->http_threads,
                           "HTTP connections served at once (128; each stream holds one)"),
           4, 4096);
  cmd->add_option("--prompt-template", o->prompt_template,
                  "--plan: the prompt template (default: the plan's)");
  in_range(cmd->add_option("--max-batch", o->max_batch,
                           "--plan: sequences stepped together (default: the plan's profile)"),
           0, 4096);
  in_range(cmd->add_option("--instances", o->instances, "--plan: engines (instance_group count)"),
           1, 16);
  in_range(cmd->add_option("--max-queue", o->max_queue,
                           "--plan: requests waiting beyond the running ones (-1: no limit); "
                           "more: 503"),
           -1, 1 << 20);
  in_range(cmd->add_option("--kv-budget-blocks", o->kv_budget_blocks,
                           "--plan: KV cache blocks of 16 positions (0: no limit)"),
           0, int64_t{1} << 40);
  in_range(cmd->add_option("--default-max-tokens", o->default_max_tokens,
                           "--plan: max_tokens of requests that set none (0: the model's)"),
           0, kMaxNewTokensLimit);
  return [o](const GlobalOptions& g) {
    KILN_CHECK_USAGE(o->repository.empty() != o->plan.empty(),
                     "give exactly one of --model-repository DIR or --plan FILE");
    KILN_CHECK_USAGE(o->load_models.empty() || o->control_mode == "explicit",
                     "--load-model needs --model-control-mode explicit");
    if (!o->plan.empty()) check_plan_file(o->plan, "--plan");
    if (!o->prompt_template.empty()) check_prompt_template(o->prompt_template);
    const std::string api_key = o->api_key_file.empty() ? "" : read_api_key(o->api_key_file);
    // SIGTERM/SIGINT go through a handler into a pipe that this thread reads below: a handler,
    // not a blocked mask and sigwait, because threads that a library starts with its own mask
    // (the CUDA driver's) would otherwise take the signal's default action and kill the server
    // mid-load without draining.
    install_stop_handler();
    auto ctx = make_context(g);
    const Logger& log = ctx->log();

    server::ManagerOptions mo;
    mo.repository = o->repository;
    mo.explicit_control = o->control_mode == "explicit";
    mo.threads = g.threads;
    mo.log_level = log.level();
    server::ModelManager models(mo, log);
    std::unique_ptr<server::RequestLog> request_log;
    if (!o->request_log.empty()) {
      request_log = server::RequestLog::open(o->request_log, log);
      models.set_request_observer([rl = request_log.get()](const std::string& model,
                                                           int64_t version,
                                                           const RequestRecord& r) {
        rl->write(model, version, r, r.tag);
      });
    }

    server::HttpOptions ho;
    ho.host = o->host;
    ho.port = o->http_port;
    ho.api_key = api_key;
    ho.max_body_bytes = static_cast<size_t>(o->max_body_bytes);
    ho.threads = o->http_threads;
    server::HttpFrontend http(models, ho, log);
    // Listening before the models load: liveness answers at once, readiness once they are in.
    http.start();
    out("kiln serve: HTTP on http://{}:{}\n", o->host, http.port());
    std::unique_ptr<server::GrpcFrontend> grpc;
    if (o->grpc_port >= 0) {
      server::GrpcOptions go;
      go.host = o->host;
      go.port = o->grpc_port;
      go.api_key = api_key;
      grpc = std::make_unique<server::GrpcFrontend>(models, go, log);
      grpc->start();
      out("kiln serve: gRPC on {}:{}\n", o->host, grpc->port());
    }
    std::unique_ptr<server::MetricsFrontend> metrics;
    if (o->metrics_port >= 0) {
      metrics = std::make_unique<server::MetricsFrontend>(models, o->host, o->metrics_port, log);
      metrics->start();
      out("kiln serve: metrics on http://{}:{}/metrics\n", o->host, metrics->port());
    }
    std::fflush(stdout);

    if (!o->plan.empty()) {
      // A config.pbtxt with nothing in it: the LLM defaults (text_input -> text_output).
      server::ModelSettings s = server::parse_model_config("", "--plan", log);
      s.name = o->name.empty() ? std::filesystem::path(o->plan).stem().string() : o->name;
      KILN_CHECK_USAGE(server::valid_model_name(s.name),
                       "--name \"{}\": use letters, digits, _ . - only", s.name);
      s.max_batch_size = o->max_batch;
      s.instance_count = o->instances;
      s.max_queue_size = o->max_queue;
      s.kv_budget_blocks = o->kv_budget_blocks;
      s.default_max_tokens = o->default_max_tokens;
      if (!o->prompt_template.empty()) {
        s.has_prompt_template = true;
        s.prompt_template = o->prompt_template;
      }
      s.config.set_name(s.name);
      s.config.set_platform("kiln_plan");
      s.config.set_max_batch_size(o->max_batch);
      models.add_plan(o->plan, s);
    } else if (mo.explicit_control) {
      for (const std::string& name : o->load_models) models.load(name);
    } else {
      models.load_all();
    }
    models.startup_done();
    size_t ready = models.ready_models().size();
    out("kiln serve: {} model version(s) ready{}\n", ready,
        models.all_ready() ? "" : " (some failed: see the log and /v2/repository/index)");
    std::fflush(stdout);

    const int sig = wait_for_stop_signal();
    log.warn("{}: draining (up to {:.0f} s for {} requests in flight), then exiting",
             sig == SIGTERM ? "SIGTERM" : "SIGINT", o->drain_timeout, [&] {
               int64_t n = 0;
               for (auto& m : models.ready_models()) n += m->in_flight();
               return n;
             }());
    http.set_draining();
    const auto until =
        Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(o->drain_timeout * 1000));
    const bool all = models.drain(until);
    if (!all) log.warn("drain timeout: the requests still running were cancelled");
    // Give the streams a moment to write their last events before the sockets close.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    if (grpc) grpc->shutdown(Clock::now() + std::chrono::seconds(2));
    http.stop();
    if (metrics) metrics->stop();
    out("kiln serve: stopped\n");
    return 0;
  };
}

}  // namespace kiln::cli
