// kiln perf's protocol clients end to end against an in-process server that streams known events
// at known times (the OpenAI and Triton generate formats), so that the parsing, the token
// counts and the timings are checked against what was sent. Only lower bounds of times are
// checked (the server's own sleeps), never how fast anything was.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <httplib.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <thread>

#include "perf_client.h"

namespace kiln::cli::perf {
namespace {

using std::chrono::milliseconds;

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// Sends `events` (each a full SSE event, "data: ...\n\n") one network write apiece, after
// `first_delay` and then `gap` between them.
void stream_events(httplib::Response& res, std::vector<std::string> events,
                   milliseconds first_delay, milliseconds gap) {
  res.set_chunked_content_provider(
      "text/event-stream",
      [events, first_delay, gap, i = size_t{0}](size_t, httplib::DataSink& sink) mutable {
        std::this_thread::sleep_for(i == 0 ? first_delay : gap);
        if (i < events.size()) {
          const std::string& e = events[i++];
          sink.write(e.data(), e.size());
        }
        if (i == events.size()) sink.done();
        return true;
      });
}

class FakeServer {
 public:
  FakeServer() {
    server_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      last_body = nlohmann::json::parse(req.body);
      last_auth = req.get_header_value("Authorization");
      const nlohmann::json& b = last_body;
      if (b["model"] != "m") {
        res.status = 404;
        res.set_content(R"({"error": {"message": "no model named x", "type": "invalid"}})",
                        "application/json");
        return;
      }
      if (!b["stream"].get<bool>()) {
        res.set_content(R"({"choices": [{"text": " a b c", "index": 0}],
                            "usage": {"prompt_tokens": 3, "completion_tokens": 3}})",
                        "application/json");
        return;
      }
      // Five tokens, the first after 30 ms, then every 10 ms; one event split over two lines
      // with CRLF endings, a keep-alive comment, and the usage chunk asked for.
      std::vector<std::string> events = {
          "data: {\"choices\": [{\"text\": \" a\", \"index\": 0}]}\n\n",
          ": keep-alive\r\ndata: {\"choices\": [{\"text\": \" b\", \"index\": 0}]}\r\n\r\n",
          "data: {\"choices\": [{\"text\": \" c\", \"index\": 0}]}\n\n",
          "data: {\"choices\": [{\"text\": \" d\", \"index\": 0}]}\n\n",
          "data: {\"choices\": [{\"text\": \" e\", \"index\": 0, \"finish_reason\": "
          "\"length\"}]}\n\n"};
      if (b.contains("stream_options") && !omit_usage)
        events.push_back("data: {\"choices\": [], \"usage\": {\"completion_tokens\": 5}}\n\n");
      if (!omit_done) events.push_back("data: [DONE]\n\n");
      stream_events(res, events, milliseconds(30), milliseconds(slow ? 400 : 10));
    });
    server_.Post("/v2/models/m/generate_stream", [this](const httplib::Request& req,
                                                        httplib::Response& res) {
      last_body = nlohmann::json::parse(req.body);
      // Three events of two token ids each; the second's text held back (a
      // partial character), which still carries tokens.
      stream_events(res,
                    {R"(data: {"model_name": "m", "text_output": " a b", "token_ids": [5, 6]})"
                     "\n\n",
                     R"(data: {"model_name": "m", "text_output": "", "token_ids": [7, 8]})"
                     "\n\n",
                     R"(data: {"model_name": "m", "text_output": " c d", "token_ids": [9, 10]})"
                     "\n\n"},
                    milliseconds(20), milliseconds(10));
    });
    server_.Post("/v2/models/m/generate", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(
          R"({"model_name": "m", "text_output": " a b c d", "token_ids": [1, 2, 3, 4]})",
          "application/json");
    });
    server_.Post(
        "/v2/models/bad/generate_stream", [](const httplib::Request&, httplib::Response& res) {
          stream_events(
              res,
              {"data: {\"model_name\": \"bad\", \"text_output\": \"a\"}\n\n", "data: not json\n\n"},
              milliseconds(0), milliseconds(0));
        });
    port_ = server_.bind_to_any_port("127.0.0.1");
    // Bound and listening already: connections wait in the backlog until the loop accepts them.
    thread_ = std::thread([this] { server_.listen_after_bind(); });
  }
  ~FakeServer() {
    server_.stop();
    thread_.join();
  }
  Target target(Protocol protocol, bool stream) const {
    Target t;
    parse_url(fmt::format("http://127.0.0.1:{}", port_), t);
    t.model = "m";
    t.protocol = protocol;
    t.stream = stream;
    t.output_len = 5;
    return t;
  }

  nlohmann::json last_body;
  std::string last_auth;
  bool omit_usage = false, omit_done = false, slow = false;

 private:
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
};

TEST(PerfClient, OpenAiStreamed) {
  FakeServer server;
  Target t = server.target(Protocol::kOpenAi, true);
  t.api_key = "sk-test";
  Connection c(t);
  const RequestResult r = run_openai(c, t, "hello");
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(server.last_body["stream_options"]["include_usage"], true);
  EXPECT_EQ(server.last_auth, "Bearer sk-test");
  EXPECT_EQ(r.output_tokens, 5);
  EXPECT_TRUE(r.tokens_counted_by_server);
  ASSERT_TRUE(r.first_token && r.last_token);
  // Times are taken when events arrive, at least as late as the server sent them; the first one
  // may arrive late, so the gap between first and last has no lower bound, only each's time.
  EXPECT_GE(ms(*r.first_token - r.sent), 30);  // the server waited 30 ms
  EXPECT_GE(ms(*r.last_token - r.sent), 70);   // then 4 gaps of 10 ms
  EXPECT_LE(*r.last_token, r.done);
  EXPECT_FALSE(r.unreachable);

  // The same connection again (kept alive), and without the usage chunk: tokens are the events.
  server.omit_usage = true;
  const RequestResult counted = run_request(c, t, "hello");
  ASSERT_EQ(counted.error, "");
  EXPECT_EQ(counted.output_tokens, 5);
  EXPECT_FALSE(counted.tokens_counted_by_server);

  server.omit_done = true;
  EXPECT_EQ(run_openai(c, t, "hello").error, "the stream ended without \"data: [DONE]\"");
}

TEST(PerfClient, OpenAiWhole) {
  FakeServer server;
  const Target t = server.target(Protocol::kOpenAi, false);
  Connection c(t);
  const RequestResult r = run_openai(c, t, "hello");
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.output_tokens, 3);  // usage.completion_tokens, not --output-len
  EXPECT_TRUE(r.tokens_counted_by_server);
  EXPECT_FALSE(r.first_token.has_value());
  EXPECT_EQ(server.last_body["stream"], false);
  EXPECT_FALSE(server.last_body.contains("stream_options"));
}

TEST(PerfClient, KserveStreamed) {
  FakeServer server;
  const Target t = server.target(Protocol::kKserve, true);
  Connection c(t);
  const RequestResult r = run_kserve(c, t, "hello");
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(server.last_body["text_input"], "hello");
  EXPECT_EQ(server.last_body["parameters"]["return_token_ids"], true);
  EXPECT_EQ(r.output_tokens, 6);  // the token ids of all three events
  EXPECT_TRUE(r.tokens_counted_by_server);
  ASSERT_TRUE(r.first_token && r.last_token);
  EXPECT_GE(ms(*r.first_token - r.sent), 20);
  EXPECT_GE(ms(*r.last_token - r.sent), 40);  // 20 ms, then 2 gaps of 10 ms
}

TEST(PerfClient, KserveWhole) {
  FakeServer server;
  const Target t = server.target(Protocol::kKserve, false);
  Connection c(t);
  const RequestResult r = run_kserve(c, t, "hello");
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.output_tokens, 4);
  EXPECT_TRUE(r.tokens_counted_by_server);
}

TEST(PerfClient, Errors) {
  FakeServer server;
  Target t = server.target(Protocol::kOpenAi, true);
  t.model = "x";
  Connection c(t);
  RequestResult r = run_openai(c, t, "hello");
  EXPECT_EQ(r.error, "HTTP 404: no model named x");
  EXPECT_FALSE(r.unreachable);

  t = server.target(Protocol::kKserve, true);
  t.model = "bad";
  r = run_kserve(c, t, "hello");
  EXPECT_EQ(r.error, "the response is not a JSON object: not json");

  t = server.target(Protocol::kKserve, false);
  t.model = "nothing";  // no such route: httplib's own 404 with an empty body
  r = run_kserve(c, t, "hello");
  EXPECT_EQ(r.error.rfind("HTTP 404", 0), 0u) << r.error;
}

TEST(PerfClient, Unreachable) {
  // A port that was just free: bound, then closed again, so nothing listens on it.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  ASSERT_GE(fd, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  ::close(fd);
  const int port = ntohs(addr.sin_port);
  Target t;
  parse_url(fmt::format("http://127.0.0.1:{}", port), t);
  t.model = "m";
  t.timeout_s = 5;  // should something answer after all, fail in seconds
  Connection c(t);
  const RequestResult r = run_openai(c, t, "hello");
  EXPECT_TRUE(r.unreachable);
  EXPECT_NE(r.error.find("could not connect"), std::string::npos) << r.error;
}

TEST(PerfClient, AbandonedAtTheDeadline) {
  FakeServer server;
  server.slow = true;  // 400 ms between events
  const Target t = server.target(Protocol::kOpenAi, true);
  Connection c(t);
  const Clock::time_point deadline = Clock::now() + milliseconds(100);
  const RequestResult r = run_openai(c, t, "hello", deadline);
  EXPECT_EQ(r.error, "abandoned at the end of the measurement window");
  EXPECT_GT(r.done, deadline);  // so never counted
  EXPECT_LT(ms(r.done - deadline), 2000);
}

}  // namespace
}  // namespace kiln::cli::perf
