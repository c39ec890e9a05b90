// The metrics port (Triton's 8002): GET /metrics in Prometheus' text format, on its own
// httplib server and thread so that a slow or stuck scrape never holds up inference traffic.
// Like Triton's, it needs no API key (health and metrics are exempt).
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "core/logging.h"

namespace httplib {
class Server;
}

namespace kiln::server {

class GpuMetrics;
class ModelManager;

class MetricsFrontend {
 public:
  // gpu_metrics: look for NVML at start() (Triton's --allow-gpu-metrics).
  MetricsFrontend(ModelManager& models, std::string host, int port, const Logger& log,
                  bool gpu_metrics = true);
  ~MetricsFrontend();  // stop()
  MetricsFrontend(const MetricsFrontend&) = delete;
  MetricsFrontend& operator=(const MetricsFrontend&) = delete;

  // Binds and starts serving; port 0 binds a free port (port() tells which). Throws ServerError
  // naming host:port when it cannot bind.
  void start();
  int port() const { return port_; }
  // Stops serving and joins the thread; idempotent.
  void stop();
  // The page (what GET /metrics returns).
  std::string render() const;

 private:
  ModelManager& models_;
  std::string host_;
  int port_;
  const Logger& log_;
  bool want_gpu_;
  std::unique_ptr<GpuMetrics> gpu_;
  std::unique_ptr<httplib::Server> server_;
  std::thread thread_;
  std::atomic<bool> listening_done_{false};
};

}  // namespace kiln::server
