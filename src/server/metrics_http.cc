#include "server/metrics_http.h"

#include <cerrno>
#include <chrono>
#include <cstring>

#include <sys/socket.h>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "server/errors.h"
#include "server/gpu_metrics.h"
#include "server/metrics.h"
#include "server/model_manager.h"

namespace kiln::server {

namespace {
constexpr const char* kContentType = "text/plain; version=0.0.4; charset=utf-8";

void json_error(httplib::Response& res, int status, const std::string& message) {
  res.status = status;
  res.set_content(nlohmann::json{{"error", message}}.dump(), "application/json");
}
}  // namespace

MetricsFrontend::MetricsFrontend(ModelManager& models, std::string host, int port,
                                 const Logger& log, bool gpu_metrics)
    : models_(models), host_(std::move(host)), port_(port), log_(log), want_gpu_(gpu_metrics) {}

MetricsFrontend::~MetricsFrontend() { stop(); }

std::string MetricsFrontend::render() const { return render_metrics(models_, gpu_.get()); }

void MetricsFrontend::start() {
  KILN_CHECK(server_ == nullptr, "metrics: start() called twice");
  if (want_gpu_) {
    std::string why_not;
    gpu_ = GpuMetrics::open(&why_not);
    if (gpu_ != nullptr)
      log_.info("metrics: GPU metrics from NVML for {}", gpu_->describe());
    else
      log_.info("metrics: {}", why_not);
  }
  auto server = std::make_unique<httplib::Server>();
  // Scrapes are rare and cheap: two workers instead of httplib's one per core.
  server->new_task_queue = [] { return new httplib::ThreadPool(2); };
  // httplib's default sets SO_REUSEPORT alone on Linux, with which a second server binds the
  // same port and the kernel splits connections between the two: a port in use must be an
  // error. SO_REUSEADDR still lets a restarted server bind over connections in TIME_WAIT.
  server->set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  server->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    try {
      res.set_content(render(), kContentType);
    } catch (const std::exception& e) {
      json_error(res, 500, std::string("metrics: ") + e.what());
    }
  });
  // Anything else (another path, or a method other than GET/HEAD) is an unknown route. The error
  // handler runs for every error status whose body is still empty.
  server->set_error_handler([](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return;
    if (res.status == 404)
      json_error(
          res, 404,
          fmt::format("not found: {} {} (this port serves GET /metrics)", req.method, req.path));
    else
      json_error(res, res.status, fmt::format("{} {}: HTTP {}", req.method, req.path, res.status));
  });

  errno = 0;
  int bound = -1;
  if (port_ == 0)
    bound = server->bind_to_any_port(host_);
  else
    bound = server->bind_to_port(host_, port_) ? port_ : -1;
  if (bound < 0) {
    const int err = errno;
    KILN_SERVER_FAIL(Code::kUnavailable, "metrics: cannot listen on {}:{}{}", host_, port_,
                     err != 0 ? fmt::format(" ({})", std::strerror(err))
                              : std::string(" (address in use, or not an address of this host)"));
  }
  port_ = bound;
  server_ = std::move(server);
  listening_done_ = false;
  thread_ = std::thread([this] {
    if (!server_->listen_after_bind()) log_.warn("metrics: the server on port {} failed", port_);
    listening_done_ = true;
  });
  // httplib's stop() only acts once the accept loop runs: wait for it, so that a stop() right
  // after start() cannot be lost (and the thread left running forever).
  while (!server_->is_running() && !listening_done_)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  log_.info("metrics: serving http://{}:{}/metrics", host_, port_);
}

void MetricsFrontend::stop() {
  if (server_ == nullptr) return;
  server_->stop();
  if (thread_.joinable()) thread_.join();
  server_.reset();
}

}  // namespace kiln::server
