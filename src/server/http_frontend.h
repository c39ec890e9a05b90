// The HTTP frontend: KServe v2 (Open Inference Protocol) with the binary tensor extension,
// Triton's generate extension (with Server-Sent Events) and the OpenAI-compatible API, on one
// port (cpp-httplib, a thread per connection from a fixed pool).
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "core/logging.h"
#include "server/model_manager.h"

namespace httplib {
class Server;
}

namespace kiln::server {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;      // 0: any free port (port() tells which)
  std::string api_key;  // empty: no authentication
  size_t max_body_bytes = 16 << 20;
  int threads = 128;  // connections served at once (each stream holds one)
};

// Per-finished-request hook (the request log); called on the engine thread.
class HttpFrontend {
 public:
  HttpFrontend(ModelManager& models, HttpOptions options, const Logger& log);
  ~HttpFrontend();
  // Binds and starts serving on a thread; throws ServerError naming the address when it cannot.
  void start();
  int port() const { return port_; }
  // Draining: inference requests get 503 and readiness turns false; in-flight ones finish.
  void set_draining() { draining_ = true; }
  void stop();

  struct Context;  // what the route files share (http_routes.h)

 private:
  std::unique_ptr<Context> ctx_;
  std::unique_ptr<httplib::Server> server_;
  HttpOptions options_;
  const Logger& log_;
  std::atomic<bool> draining_{false};
  int port_ = 0;
  std::thread thread_;
};

}  // namespace kiln::server
