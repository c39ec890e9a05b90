#include "perf_client.h"

#include <httplib.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>

#include "core/status.h"

namespace kiln::cli::perf {

// --- Server-Sent Events ---

bool SseParser::feed(std::string_view bytes) {
  for (const char c : bytes) {
    if (after_cr_) {
      after_cr_ = false;
      if (c == '\n') continue;  // the "\n" of a "\r\n" split across reads
    }
    if (c == '\r' || c == '\n') {
      after_cr_ = c == '\r';
      if (!end_line()) return false;
    } else {
      line_ += c;
    }
  }
  return true;
}

bool SseParser::finish() {
  if (!line_.empty() && !end_line()) return false;
  return dispatch();
}

bool SseParser::end_line() {
  if (line_.empty()) return dispatch();
  std::string line = std::move(line_);
  line_.clear();
  if (line[0] == ':') return true;  // a comment (servers send them as keep-alives)
  const size_t colon = line.find(':');
  if (line.compare(0, colon, "data") != 0) return true;  // event:, id:, retry:
  std::string_view value;
  if (colon != std::string::npos) {
    value = std::string_view(line).substr(colon + 1);
    if (value.starts_with(' ')) value.remove_prefix(1);
  }
  if (has_data_) data_ += '\n';
  data_ += value;
  has_data_ = true;
  return true;
}

bool SseParser::dispatch() {
  if (!has_data_) return true;
  const std::string data = std::move(data_);
  data_.clear();
  has_data_ = false;
  return on_event_(data);
}

// --- targets ---

const char* protocol_name(Protocol p) {
  switch (p) {
    case Protocol::kOpenAi:
      return "openai";
    case Protocol::kKserve:
      return "kserve";
    case Protocol::kGrpc:
      return "grpc";
  }
  return "?";
}

void parse_url(const std::string& url, Target& target) {
  std::string rest = url, scheme = "http";
  const size_t sep = url.find("://");
  if (sep != std::string::npos) {
    scheme = url.substr(0, sep);
    rest = url.substr(sep + 3);
    KILN_CHECK_USAGE(scheme == "http" || scheme == "https",
                     "--url {}: the scheme must be http:// or https://", url);
  }
  const size_t slash = rest.find('/');
  const std::string host_port = rest.substr(0, slash);
  std::string path = slash == std::string::npos ? "" : rest.substr(slash);
  while (!path.empty() && path.back() == '/') path.pop_back();
  KILN_CHECK_USAGE(!host_port.empty() && host_port.find_first_of("?#@ ") == std::string::npos,
                   "--url {}: expected http://HOST:PORT (e.g. http://localhost:8000)", url);
  const size_t colon = host_port.rfind(':');
  if (colon != std::string::npos && host_port.find(']', colon) == std::string::npos) {
    const std::string port = host_port.substr(colon + 1);
    char* end = nullptr;
    const long n = std::strtol(port.c_str(), &end, 10);
    KILN_CHECK_USAGE(!port.empty() && *end == '\0' && n >= 1 && n <= 65535 && colon > 0,
                     "--url {}: '{}' is not a port (1..65535)", url, port);
  }
  target.scheme_host_port = scheme + "://" + host_port;
  target.base_path = path;
}

Connection::Connection(const Target& target) {
  if (target.protocol == Protocol::kGrpc) {
    grpc_ = open_grpc(target);
    return;
  }
  client_ = std::make_unique<httplib::Client>(target.scheme_host_port);
  KILN_CHECK_USAGE(client_->is_valid(), "--url {}: not a URL this client can use",
                   target.scheme_host_port);
  client_->set_keep_alive(true);
  // httplib writes the headers and the body separately: with Nagle's algorithm the body would
  // wait for the server's delayed ACK (up to 40 ms on Linux), which would be measured as TTFT.
  client_->set_tcp_nodelay(true);
  // A server that does not answer the connection at all (a firewalled port) is reported in
  // seconds, not after a generation-sized timeout.
  const double connect_s = std::min(target.timeout_s, 10.0);
  client_->set_connection_timeout(std::chrono::microseconds(static_cast<int64_t>(connect_s * 1e6)));
  client_->set_write_timeout(
      std::chrono::microseconds(static_cast<int64_t>(target.timeout_s * 1e6)));
}

Connection::~Connection() = default;

namespace {

std::string path_escape(const std::string& s) {
  std::string out;
  for (const unsigned char c : s) {
    if (std::isalnum(c) || c == '-' || c == '_' || c == '.' || c == '~')
      out += static_cast<char>(c);
    else
      out += fmt::format("%{:02X}", c);
  }
  return out;
}

std::string shorten(std::string_view s, size_t n = 300) {
  return s.size() <= n ? std::string(s) : std::string(s.substr(0, n)) + "...";
}

// The message of an error body: OpenAI's {"error": {"message": ...}}, KServe's {"error": "..."},
// else the text itself.
std::string error_message(const std::string& body) {
  const nlohmann::json j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error")) {
    const nlohmann::json& e = j["error"];
    if (e.is_string()) return e.get<std::string>();
    if (e.is_object() && e.contains("message") && e["message"].is_string())
      return e["message"].get<std::string>();
    return shorten(e.dump());
  }
  return shorten(body);
}

// What one response has said so far. The handlers return an error message ("" when the event
// was fine).
struct ResponseState {
  Clock::time_point arrived;  // of the network read that carried the current event
  std::optional<Clock::time_point> first_token, last_token;
  int64_t events = 0;
  int64_t output_events = 0;              // events that carried text or token ids
  std::optional<int64_t> counted_tokens;  // usage.completion_tokens, or token ids seen
  bool done_marker = false;               // OpenAI's "data: [DONE]"
  std::string head;                       // the stream's first bytes, for errors

  void output(bool carried) {
    if (!carried) return;
    ++output_events;
    if (!first_token) first_token = arrived;
    last_token = arrived;
  }
};

// A JSON object, or why not.
std::optional<nlohmann::json> parse_object(const std::string& text, std::string& error) {
  nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  if (!j.is_object()) {
    error = "the response is not a JSON object: " + shorten(text);
    return std::nullopt;
  }
  if (j.contains("error")) {
    error = "the server said: " + error_message(text);
    return std::nullopt;
  }
  return j;
}

std::string openai_event(const std::string& data, ResponseState& p) {
  if (data == "[DONE]") {
    p.done_marker = true;
    return {};
  }
  std::string error;
  const std::optional<nlohmann::json> j = parse_object(data, error);
  if (!j) return error;
  const auto usage = j->find("usage");
  if (usage != j->end() && usage->is_object() && usage->contains("completion_tokens") &&
      (*usage)["completion_tokens"].is_number_integer())
    p.counted_tokens = (*usage)["completion_tokens"].get<int64_t>();
  const auto choices = j->find("choices");
  if (choices == j->end() || !choices->is_array())
    return usage != j->end() ? "" : "an event without \"choices\": " + shorten(data);
  if (choices->empty()) return {};  // the usage chunk
  const nlohmann::json& c = (*choices)[0];
  if (!c.is_object() || !c.contains("text") || !c["text"].is_string())
    return "an event without choices[0].text: " + shorten(data);
  p.output(!c["text"].get<std::string>().empty());
  return {};
}

std::string kserve_event(const std::string& data, ResponseState& p) {
  std::string error;
  const std::optional<nlohmann::json> j = parse_object(data, error);
  if (!j) return error;
  const auto text = j->find("text_output");
  if (text == j->end() || !text->is_string())
    return "an event without a \"text_output\" string: " + shorten(data);
  int64_t ids = 0;
  const auto token_ids = j->find("token_ids");
  if (token_ids != j->end() && token_ids->is_array()) {
    ids = static_cast<int64_t>(token_ids->size());
    p.counted_tokens = p.counted_tokens.value_or(0) + ids;
  }
  p.output(!text->get<std::string>().empty() || ids > 0);
  return {};
}

// A response in one piece: its text must be there; tokens as the server counted them.
std::string whole_response(const Target& t, const std::string& body, ResponseState& p) {
  std::string error;
  const std::optional<nlohmann::json> j = parse_object(body, error);
  if (!j) return error;
  switch (t.protocol) {
    case Protocol::kOpenAi: {
      const auto choices = j->find("choices");
      if (choices == j->end() || !choices->is_array() || choices->empty() ||
          !(*choices)[0].is_object() || !(*choices)[0].contains("text") ||
          !(*choices)[0]["text"].is_string())
        return "a response without choices[0].text: " + shorten(body);
      const auto usage = j->find("usage");
      if (usage != j->end() && usage->is_object() && usage->contains("completion_tokens") &&
          (*usage)["completion_tokens"].is_number_integer())
        p.counted_tokens = (*usage)["completion_tokens"].get<int64_t>();
      return {};
    }
    case Protocol::kKserve: {
      const auto text = j->find("text_output");
      if (text == j->end() || !text->is_string())
        return "a response without a \"text_output\" string: " + shorten(body);
      const auto ids = j->find("token_ids");
      if (ids != j->end() && ids->is_array()) p.counted_tokens = static_cast<int64_t>(ids->size());
      return {};
    }
    case Protocol::kGrpc:
      break;
  }
  return "gRPC responses do not come over HTTP";
}

}  // namespace

std::string request_path(const Target& t) {
  switch (t.protocol) {
    case Protocol::kOpenAi:
      return t.base_path + "/v1/completions";
    case Protocol::kKserve:
      return t.base_path + "/v2/models/" + path_escape(t.model) +
             (t.stream ? "/generate_stream" : "/generate");
    case Protocol::kGrpc:
      break;
  }
  return "";
}

std::string request_body(const Target& t, const std::string& prompt) {
  nlohmann::json j;
  switch (t.protocol) {
    case Protocol::kOpenAi:
      j = {{"model", t.model},
           {"prompt", prompt},
           {"max_tokens", t.output_len},
           {"temperature", t.temperature},
           {"stream", t.stream}};
      // The token count comes in a last chunk (choices: []) only when asked for.
      if (t.stream) j["stream_options"] = {{"include_usage", true}};
      if (t.ignore_eos) j["ignore_eos"] = true;
      break;
    case Protocol::kKserve:
      j = {{"text_input", prompt},
           {"parameters",
            {{"max_tokens", t.output_len},
             {"temperature", t.temperature},
             {"return_token_ids", true}}}};
      if (t.ignore_eos) j["parameters"]["ignore_eos"] = true;
      break;
    case Protocol::kGrpc:
      break;
  }
  return j.dump();
}

namespace {

// What httplib's error means to a user (httplib keeps the system's reason to itself: errno is
// left at EINPROGRESS by its non-blocking connect).
std::string transport_error(httplib::Error e) {
  if (e == httplib::Error::Connection)
    return "could not connect (nothing listens there, or the host name does not resolve)";
  if (e == httplib::Error::ConnectionTimeout) return "the connection timed out";
  if (e == httplib::Error::Read) return "the connection failed while reading the response";
  if (e == httplib::Error::Write) return "the connection failed while sending the request";
  if (e == httplib::Error::SSLConnection) return "the TLS handshake failed";
  if (e == httplib::Error::SSLServerVerification) return "the server's TLS certificate was refused";
  return httplib::to_string(e);
}

using EventHandler = std::string (*)(const std::string& data, ResponseState& p);

// A POST whose response is read as it arrives: SSE events through `on_event` when streamed,
// else the whole body.
RequestResult run_http(httplib::Client& client, const Target& t, const std::string& prompt,
                       Clock::time_point deadline, EventHandler on_event) {
  RequestResult r;
  ResponseState p;
  std::string error, body;
  int status = -1;
  bool aborted = false;  // by us, at the deadline or at a bad event
  SseParser sse([&](const std::string& data) {
    ++p.events;
    error = on_event(data, p);
    return error.empty();
  });

  httplib::Request req;
  req.method = "POST";
  req.path = request_path(t);
  req.body = request_body(t, prompt);
  req.set_header("Content-Type", "application/json");
  req.set_header("Accept", t.stream ? "text/event-stream" : "application/json");
  if (!t.api_key.empty()) req.set_header("Authorization", "Bearer " + t.api_key);
  req.response_handler = [&](const httplib::Response& res) {
    status = res.status;
    return true;  // read the body either way: an error's body says what went wrong
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    p.arrived = Clock::now();
    if (p.arrived > deadline) {
      aborted = true;
      return false;
    }
    if (status != 200 || !t.stream) {
      if (body.size() < (size_t{1} << 26)) body.append(data, n);  // enough to say what is wrong
      return true;
    }
    if (p.head.size() < 300) p.head.append(data, std::min(n, 300 - p.head.size()));
    if (!sse.feed(std::string_view(data, n))) {
      aborted = true;
      return false;
    }
    return true;
  };
  // Bounded by the deadline too, so that a request answered in one piece does not hold up the
  // end of a concurrency level: it times out a second after the window closes.
  double read_s = t.timeout_s;
  r.sent = Clock::now();
  if (deadline != Clock::time_point::max())
    read_s = std::min(read_s, std::chrono::duration<double>(deadline - r.sent).count() + 1.0);
  read_s = std::max(read_s, 0.001);
  client.set_read_timeout(std::chrono::microseconds(static_cast<int64_t>(read_s * 1e6)));

  const httplib::Result res = client.send(req);
  r.done = Clock::now();
  if (!res) {
    const httplib::Error e = res.error();
    r.unreachable = e == httplib::Error::Connection || e == httplib::Error::ConnectionTimeout ||
                    e == httplib::Error::SSLConnection;
    if (aborted && !error.empty())
      r.error = error;
    else if (aborted)
      r.error = "abandoned at the end of the measurement window";
    else if (e == httplib::Error::Read &&
             std::chrono::duration<double>(r.done - r.sent).count() >= read_s * 0.99)
      r.error = fmt::format("no data from the server for {:g} s{}", read_s,
                            read_s == t.timeout_s ? " (--timeout)" : "");
    else
      r.error = transport_error(e);
    return r;
  }
  if (status != 200) {
    r.error = fmt::format("HTTP {}: {}", status, error_message(body));
    return r;
  }
  if (t.stream) {
    if (!sse.finish() || !error.empty()) {
      r.error = error;
      return r;
    }
    if (t.protocol == Protocol::kOpenAi && !p.done_marker) {
      r.error = "the stream ended without \"data: [DONE]\"";
      return r;
    }
    if (p.events == 0) {
      r.error = "no Server-Sent Events in the response: " + shorten(p.head);
      return r;
    }
    if (p.output_events == 0 && p.counted_tokens.value_or(0) == 0) {
      r.error = "the stream carried no output";
      return r;
    }
    r.first_token = p.first_token;
    r.last_token = p.last_token;
    r.tokens_counted_by_server = p.counted_tokens.has_value();
    r.output_tokens = p.counted_tokens.value_or(p.output_events);
    return r;
  }
  error = whole_response(t, body, p);
  if (!error.empty()) {
    r.error = error;
    return r;
  }
  r.tokens_counted_by_server = p.counted_tokens.has_value();
  // Without a count from the server, the tokens asked for (the caller says so in its output).
  r.output_tokens = p.counted_tokens.value_or(t.output_len);
  return r;
}

}  // namespace

RequestResult run_openai(Connection& c, const Target& t, const std::string& prompt,
                         Clock::time_point deadline) {
  return run_http(c.client(), t, prompt, deadline, openai_event);
}

RequestResult run_kserve(Connection& c, const Target& t, const std::string& prompt,
                         Clock::time_point deadline) {
  return run_http(c.client(), t, prompt, deadline, kserve_event);
}

RequestResult run_request(Connection& c, const Target& t, const std::string& prompt,
                          Clock::time_point deadline) {
  switch (t.protocol) {
    case Protocol::kOpenAi:
      return run_openai(c, t, prompt, deadline);
    case Protocol::kKserve:
      return run_kserve(c, t, prompt, deadline);
    case Protocol::kGrpc:
      return run_grpc(c, t, prompt, deadline);
  }
  KILN_FAIL("unknown protocol");
}

}  // namespace kiln::cli::perf
