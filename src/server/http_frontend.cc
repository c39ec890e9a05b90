// The HTTP server: binding, authentication, limits, error bodies, SSE streaming; the routes are
// in kserve_http.cc, generate_http.cc and openai_http.cc.
#include "server/http_frontend.h"

#include "server/http_routes.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>
#include <charconv>
#include <filesystem>

namespace kiln::server {

void reply_json(httplib::Response& res, const Json& body, int status) {
  res.status = status;
  res.set_content(body.dump(-1, ' ', false, Json::error_handler_t::replace), "application/json");
}

void reply_error(httplib::Response& res, const ServerError& e) {
  reply_json(res, Json{{"error", e.what()}}, http_status(e.code()));
}

void reply_openai_error(httplib::Response& res, const ServerError& e) {
  const char* type = "invalid_request_error";
  const char* code = nullptr;
  switch (e.code()) {
    case Code::kNotFound:
      code = "model_not_found";
      break;
    case Code::kUnauthorized:
      type = "authentication_error";
      code = "invalid_api_key";
      break;
    case Code::kQueueFull:
    case Code::kUnavailable:
      type = "server_error";
      code = "overloaded";
      break;
    case Code::kTimeout:
      type = "timeout";
      break;
    case Code::kInternal:
      type = "server_error";
      break;
    default:
      break;
  }
  Json err{{"message", e.what()}, {"type", type}, {"param", nullptr}, {"code", nullptr}};
  if (code != nullptr) err["code"] = code;
  reply_json(res, Json{{"error", err}}, http_status(e.code()));
}

Json parse_body(const std::string& body, const char* what) {
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    // Find where it fails, for the message.
    try {
      const Json again = Json::parse(body);
      (void)again;
    } catch (const Json::parse_error& e) {
      KILN_SERVER_FAIL(Code::kBadRequest, "{} is not valid JSON (at byte {})", what, e.byte);
    }
    KILN_SERVER_FAIL(Code::kBadRequest, "{} is not valid JSON", what);
  }
  KILN_BAD_REQUEST(j.is_object(), "{} must be a JSON object", what);
  return j;
}

void guarded(httplib::Response& res, const std::function<void()>& fn, bool openai) {
  try {
    fn();
  } catch (const std::exception& e) {
    const ServerError se = to_server_error(e);
    if (openai)
      reply_openai_error(res, se);
    else
      reply_error(res, se);
  }
}

void check_not_draining(const HttpFrontend::Context& ctx) {
  if (ctx.draining.load())
    KILN_SERVER_FAIL(Code::kUnavailable, "the server is shutting down and takes no new requests");
}

namespace {

// The peer of socket `fd` as httplib writes Request::remote_addr/remote_port.
bool peer_is(int fd, const std::string& addr, int port) {
  sockaddr_storage ss{};
  socklen_t len = sizeof(ss);
  if (getpeername(fd, reinterpret_cast<sockaddr*>(&ss), &len) != 0) return false;
  char host[INET6_ADDRSTRLEN] = {0};
  int p = -1;
  if (ss.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&ss);
    inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    p = ntohs(in->sin_port);
  } else if (ss.ss_family == AF_INET6) {
    const auto* in = reinterpret_cast<const sockaddr_in6*>(&ss);
    inet_ntop(AF_INET6, &in->sin6_addr, host, sizeof(host));
    p = ntohs(in->sin6_port);
  } else {
    return false;
  }
  return p == port && addr == host;
}

}  // namespace

bool client_gone(const httplib::Request& req) {
  // httplib (0.11) does not hand a handler its socket; the connection's thread finds it once
  // among the process' descriptors by its peer (unique while the connection is open, and the
  // descriptor stays open until the handler returns).
  thread_local int cached = -1;
  if (cached < 0 || !peer_is(cached, req.remote_addr, req.remote_port)) {
    cached = -1;
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
      int fd = -1;
      const std::string name = e.path().filename().string();
      if (std::from_chars(name.data(), name.data() + name.size(), fd).ec != std::errc()) continue;
      if (peer_is(fd, req.remote_addr, req.remote_port)) {
        cached = fd;
        break;
      }
    }
    if (cached < 0) return false;  // not found (not a TCP client): never cancel
  }
  char c;
  const ssize_t n = recv(cached, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  // 0: the peer closed its side; an error other than "no data yet": the connection is broken.
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

void stream_events(httplib::Response& res, std::vector<std::shared_ptr<Generation>> gens,
                   std::function<std::string(size_t, const ResponseChunk&)> event,
                   std::function<std::string(const ServerError&)> error_event,
                   std::function<std::string()> end) {
  res.set_header("Cache-Control", "no-cache");
  res.set_header("X-Accel-Buffering", "no");
  struct State {
    std::vector<std::shared_ptr<Generation>> gens;
    std::vector<bool> done;
    size_t open = 0;
    void cancel_all() {
      for (auto& g : gens) g->cancel();
    }
  };
  auto st = std::make_shared<State>();
  st->gens = std::move(gens);
  st->done.assign(st->gens.size(), false);
  st->open = st->gens.size();
  res.set_chunked_content_provider(
      "text/event-stream",
      [st, event = std::move(event), error_event = std::move(error_event), end = std::move(end)](
          size_t, httplib::DataSink& sink) -> bool {
        std::string out;
        bool failed = false;
        // Several choices step in one batch, so their tokens come together: wait for the
        // first open one (a second at most when it is alone, so that a comment line finds out
        // whether the client is still there), then take what the others have without waiting.
        bool waited = false;
        for (size_t i = 0; i < st->gens.size() && !failed; ++i) {
          if (st->done[i]) continue;
          const auto wait =
              st->open == 1 ? std::chrono::milliseconds(1000) : std::chrono::milliseconds(20);
          const Clock::time_point until = waited ? Clock::now() : Clock::now() + wait;
          waited = true;
          std::vector<ResponseChunk> chunks;
          const bool more = st->gens[i]->next(chunks, until);
          bool finished = !more;
          for (const ResponseChunk& c : chunks) {
            if (c.finished && c.cause != EndCause::kFinished) {
              out += error_event(chunk_error(c));
              failed = true;
              break;
            }
            out += event(i, c);
            if (c.finished) finished = true;
          }
          if (finished && !st->done[i]) {
            st->done[i] = true;
            --st->open;
          }
        }
        const bool last = failed || st->open == 0;
        if (failed) st->cancel_all();
        if (last) out += end();
        // Nothing new (still queued): a comment line, which finds out whether the client is
        // still there.
        if (out.empty()) out = ": waiting\n\n";
        if (!sink.write(out.data(), out.size())) return false;  // gone: ~Generation cancels
        if (last) sink.done();
        return true;
      },
      [st](bool) { st->cancel_all(); });
}

void stream_events(httplib::Response& res, std::shared_ptr<Generation> g,
                   std::function<std::string(const ResponseChunk&)> event,
                   std::function<std::string(const ServerError&)> error_event,
                   std::function<std::string()> end) {
  stream_events(
      res, std::vector<std::shared_ptr<Generation>>{std::move(g)},
      [event = std::move(event)](size_t, const ResponseChunk& c) { return event(c); },
      std::move(error_event), std::move(end));
}

HttpFrontend::HttpFrontend(ModelManager& models, HttpOptions options, const Logger& log)
    : options_(std::move(options)), log_(log) {
  ctx_ = std::make_unique<Context>(Context{models, log, draining_});
  server_ = std::make_unique<httplib::Server>();
  httplib::Server& svr = *server_;
  const int threads = options_.threads;
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  svr.set_payload_max_length(options_.max_body_bytes);
  // httplib's default is SO_REUSEPORT, with which a second server binds the same port and the
  // kernel splits the connections between them: a port in use must be an error.
  // TCP_NODELAY (accepted sockets inherit it from the listening one): with Nagle's algorithm a
  // streamed token written while the headers were unacknowledged waited for the client's delayed
  // ACK, 40 ms on Linux: every request's first token came 40 ms late and the tokens behind it in
  // bursts, and at 64 streaming clients a slot of the batch stood empty for that long per request.
  svr.set_tcp_nodelay(true);
  svr.set_socket_options([](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof(yes));
  });
  svr.set_keep_alive_max_count(1000);
  svr.set_read_timeout(30, 0);
  svr.set_write_timeout(30, 0);
  const std::string key = options_.api_key;
  svr.set_pre_routing_handler([key](const httplib::Request& req, httplib::Response& res) {
    // Health and metrics stay open, as load balancers probe them without credentials.
    if (key.empty() || req.path == "/v2/health/live" || req.path == "/v2/health/ready")
      return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    if (auth == "Bearer " + key) return httplib::Server::HandlerResponse::Unhandled;
    ServerError e(Code::kUnauthorized, auth.empty()
                                           ? "missing Authorization header (Bearer <api key>)"
                                           : "invalid API key");
    if (req.path.rfind("/v1/", 0) == 0)
      reply_openai_error(res, e);
    else
      reply_error(res, e);
    return httplib::Server::HandlerResponse::Handled;
  });
  // Statuses httplib sets by itself (unknown route, body too large, malformed request) get a
  // JSON body too.
  const size_t limit = options_.max_body_bytes;
  svr.set_error_handler(httplib::Server::HandlerWithResponse([limit](const httplib::Request& req,
                                                                     httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string message;
    Code code = Code::kBadRequest;
    if (res.status == 404) {
      code = Code::kNotFound;
      message = fmt::format("no such endpoint: {} {}", req.method, req.path);
    } else if (res.status == 413) {
      code = Code::kTooLarge;
      // httplib keeps form-encoded bodies (curl -d without a Content-Type) to 8 KiB.
      const bool form =
          req.get_header_value("Content-Type").starts_with("application/x-www-form-urlencoded");
      message =
          form ? "a form-encoded body is limited to 8192 bytes: send the JSON with "
                 "'Content-Type: application/json'"
               : fmt::format("the request body is over the limit of {} bytes (--max-body-bytes)",
                             limit);
    } else {
      message = fmt::format("bad request (HTTP {})", res.status);
    }
    const int status = res.status;
    if (req.path.rfind("/v1/", 0) == 0)
      reply_openai_error(res, ServerError(code, message));
    else
      reply_error(res, ServerError(code, message));
    res.status = status;
    return httplib::Server::HandlerResponse::Handled;
  }));
  svr.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          reply_error(res, to_server_error(e));
        } catch (...) {
          reply_error(res, ServerError(Code::kInternal, "internal error"));
        }
      });
  add_kserve_routes(svr, *ctx_);
  add_generate_routes(svr, *ctx_);
  add_openai_routes(svr, *ctx_);
}

HttpFrontend::~HttpFrontend() { stop(); }

void HttpFrontend::start() {
  httplib::Server& svr = *server_;
  if (options_.port == 0) {
    port_ = svr.bind_to_any_port(options_.host);
    if (port_ < 0) port_ = 0;
  } else {
    port_ = svr.bind_to_port(options_.host, options_.port) ? options_.port : 0;
  }
  if (port_ == 0)
    KILN_SERVER_FAIL(Code::kInternal,
                     "cannot listen for HTTP on {}:{} (in use? pick another with --http-port)",
                     options_.host, options_.port);
  thread_ = std::thread([this] { server_->listen_after_bind(); });
  log_.info("HTTP (KServe v2, generate, OpenAI) on {}:{}", options_.host, port_);
}

void HttpFrontend::stop() {
  if (!thread_.joinable()) return;
  server_->stop();
  thread_.join();
}

}  // namespace kiln::server
