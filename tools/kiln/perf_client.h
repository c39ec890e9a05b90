// kiln perf's protocol clients: each runs one generation request against a server and says when
// its output arrived, how many tokens it had, or what went wrong.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <string_view>

#include "perf_stats.h"

namespace httplib {
class Client;
}

namespace kiln::cli::perf {

// Server-Sent Events, split as the bytes arrive: a network read may end anywhere (inside a line,
// between "\r" and "\n"), so the parser keeps what it has not finished. Lines end with "\r\n",
// "\n" or "\r"; an event is its "data:" lines (joined with "\n") up to a blank line; comments
// (":...") and other fields are skipped. feed() calls `on_event` with each complete event's data
// and stops (returning false) when it returns false.
class SseParser {
 public:
  using OnEvent = std::function<bool(const std::string& data)>;
  explicit SseParser(OnEvent on_event) : on_event_(std::move(on_event)) {}
  bool feed(std::string_view bytes);
  // At the end of the stream: an event the server did not end with a blank line is still
  // delivered (the standard drops it; a benchmark would rather see the server's last words).
  bool finish();

 private:
  bool end_line();
  bool dispatch();
  OnEvent on_event_;
  std::string line_, data_;
  bool has_data_ = false;
  bool after_cr_ = false;  // the last byte was "\r": a "\n" right after it ends no other line
};

enum class Protocol { kOpenAi, kKserve, kGrpc };
const char* protocol_name(Protocol p);

// Where requests go and what they ask for.
struct Target {
  std::string scheme_host_port;  // "http://localhost:8000"
  std::string base_path;         // "" or "/prefix" (no trailing "/")
  std::string model;
  std::string api_key;  // sent as "Authorization: Bearer ..." when not empty
  Protocol protocol = Protocol::kOpenAi;
  bool stream = false;
  int64_t output_len = 16;
  double temperature = 0.0;
  bool ignore_eos = false;
  double timeout_s = 600;
};

// "http://host:port[/path]", "https://...", or "host:port" (http); throws a usage error naming
// --url otherwise.
void parse_url(const std::string& url, Target& target);

// gRPC's channel and stub (perf_grpc.cc), kept out of this header like httplib's client.
struct GrpcChannel;
struct GrpcChannelDeleter {
  void operator()(GrpcChannel* c) const;
};
std::unique_ptr<GrpcChannel, GrpcChannelDeleter> open_grpc(const Target& target);

// A connection to the server, kept alive between the requests of one client thread: httplib's
// client, or for gRPC a channel (the libraries stay out of this header, so that only the files
// that use them depend on how they were configured). Throws a usage error when the URL cannot be
// used.
class Connection {
 public:
  explicit Connection(const Target& target);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;
  httplib::Client& client() { return *client_; }
  GrpcChannel& grpc() { return *grpc_; }

 private:
  std::unique_ptr<httplib::Client> client_;
  std::unique_ptr<GrpcChannel, GrpcChannelDeleter> grpc_;
};

// One request of each protocol. A streamed request still running at `deadline` is abandoned (its
// connection closed) at its next event; one answered in one piece waits at most a second past
// the deadline. Either way it ends after the deadline, outside the measurement window.
RequestResult run_openai(Connection& c, const Target& target, const std::string& prompt,
                         Clock::time_point deadline = Clock::time_point::max());
RequestResult run_kserve(Connection& c, const Target& target, const std::string& prompt,
                         Clock::time_point deadline = Clock::time_point::max());
// KServe v2 gRPC: a BYTES "text_input" of shape [1], parameters max_tokens, temperature,
// return_token_ids (and ignore_eos); ModelInfer, or ModelStreamInfer when streamed. Text from the
// "text_output" tensor, tokens from a "token_ids" tensor when the server sends one, else the
// responses that carried output. --timeout bounds the whole call.
RequestResult run_grpc(Connection& c, const Target& target, const std::string& prompt,
                       Clock::time_point deadline = Clock::time_point::max());
// The one of target.protocol.
RequestResult run_request(Connection& c, const Target& target, const std::string& prompt,
                          Clock::time_point deadline = Clock::time_point::max());

// The request bodies and response parsing of each protocol, exposed for tests.
std::string request_body(const Target& target, const std::string& prompt);
std::string request_path(const Target& target);

}  // namespace kiln::cli::perf
