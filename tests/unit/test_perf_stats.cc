// kiln perf's statistics (nearest-rank percentiles, aggregation over the measurement window) and
// its Server-Sent Events splitting, against values worked out by hand.
#include <gtest/gtest.h>

#include "core/status.h"
#include "perf_client.h"
#include "perf_stats.h"

namespace kiln::cli::perf {
namespace {

using std::chrono::milliseconds;

TEST(PerfStats, NearestRankPercentiles) {
  // 1..10 shuffled: the p-th percentile is the ceil(p/10)-th smallest.
  const std::vector<double> v = {7, 3, 10, 1, 9, 2, 8, 4, 6, 5};
  EXPECT_EQ(percentile(v, 10), 1);
  EXPECT_EQ(percentile(v, 50), 5);
  EXPECT_EQ(percentile(v, 51), 6);
  EXPECT_EQ(percentile(v, 90), 9);  // 0.9 * 10 is 9.000000000000002 in doubles: still rank 9
  EXPECT_EQ(percentile(v, 99), 10);
  EXPECT_EQ(percentile(v, 100), 10);
  EXPECT_EQ(percentile({42}, 1), 42);
  EXPECT_EQ(percentile({42}, 99), 42);
  // Always a measured value, never an interpolation between two.
  EXPECT_EQ(percentile({1, 2}, 50), 1);
  EXPECT_EQ(percentile({1, 2}, 50.1), 2);
  // 100 values 1..100: p99 is the 99th.
  std::vector<double> hundred;
  for (int i = 100; i >= 1; --i) hundred.push_back(i);
  EXPECT_EQ(percentile(hundred, 99), 99);
  EXPECT_EQ(percentile(hundred, 90), 90);
  EXPECT_THROW(percentile({}, 50), std::invalid_argument);
  EXPECT_THROW(percentile(v, 0), std::invalid_argument);
  EXPECT_THROW(percentile(v, 101), std::invalid_argument);
}

TEST(PerfStats, Summary) {
  EXPECT_FALSE(summarize({}).has_value());
  const std::optional<Summary> s = summarize({4, 1, 3, 2});
  ASSERT_TRUE(s.has_value());
  EXPECT_EQ(s->p50, 2);
  EXPECT_EQ(s->p90, 4);
  EXPECT_EQ(s->p99, 4);
  EXPECT_DOUBLE_EQ(s->mean, 2.5);
}

// A streamed request sent at `sent` ms whose tokens arrived at the given ms, ending at `done`.
RequestResult streamed(Clock::time_point t0, int sent, int first, int last, int done,
                       int64_t tokens) {
  RequestResult r;
  r.sent = t0 + milliseconds(sent);
  r.first_token = t0 + milliseconds(first);
  r.last_token = t0 + milliseconds(last);
  r.done = t0 + milliseconds(done);
  r.output_tokens = tokens;
  r.tokens_counted_by_server = true;
  return r;
}

TEST(PerfStats, AggregateCountsWhatEndsInTheWindow) {
  const Clock::time_point t0{};
  const Clock::time_point start = t0 + milliseconds(1000), end = t0 + milliseconds(3000);
  std::vector<RequestResult> rs;
  rs.push_back(streamed(t0, 0, 100, 500, 600, 5));        // ended in the warmup: not counted
  rs.push_back(streamed(t0, 800, 900, 1300, 1400, 5));    // began in the warmup: counted
  rs.push_back(streamed(t0, 1400, 1450, 1850, 1900, 9));  // inside
  rs.push_back(streamed(t0, 2900, 2950, 3100, 3200, 4));  // ended after the window: not counted
  RequestResult one = streamed(t0, 2000, 2040, 2040, 2050, 1);  // 1 token: no inter-token latency
  rs.push_back(one);
  RequestResult late_error;
  late_error.sent = t0 + milliseconds(2500);
  late_error.done = t0 + milliseconds(2600);
  late_error.error = "HTTP 500: second";
  RequestResult early_error = late_error;
  early_error.done = t0 + milliseconds(2100);
  early_error.error = "HTTP 503: first";
  RequestResult warmup_error = late_error;
  warmup_error.done = t0 + milliseconds(500);
  warmup_error.error = "in the warmup";
  rs.push_back(late_error);
  rs.push_back(early_error);
  rs.push_back(warmup_error);

  const LevelResult l = aggregate(4, rs, start, end);
  EXPECT_EQ(l.concurrency, 4);
  EXPECT_DOUBLE_EQ(l.window_s, 2.0);
  EXPECT_EQ(l.completed, 3);
  EXPECT_EQ(l.errors, 2);
  EXPECT_EQ(l.first_error, "HTTP 503: first");  // the one that ended first, not listed first
  EXPECT_EQ(l.output_tokens, 5 + 9 + 1);
  EXPECT_DOUBLE_EQ(l.requests_per_s, 1.5);
  EXPECT_DOUBLE_EQ(l.output_tokens_per_s, 7.5);
  ASSERT_TRUE(l.ttft_ms && l.itl_ms && l.e2e_ms);
  // TTFT: 100, 50, 40 ms.
  EXPECT_DOUBLE_EQ(l.ttft_ms->p50, 50);
  EXPECT_DOUBLE_EQ(l.ttft_ms->p99, 100);
  EXPECT_NEAR(l.ttft_ms->mean, 190.0 / 3, 1e-9);
  // ITL per request: 400 ms / 4 = 100, 400 ms / 8 = 50; the 1-token request has none.
  EXPECT_DOUBLE_EQ(l.itl_ms->p50, 50);
  EXPECT_DOUBLE_EQ(l.itl_ms->p90, 100);
  EXPECT_DOUBLE_EQ(l.itl_ms->mean, 75);
  // End to end: 600, 500, 50 ms.
  EXPECT_DOUBLE_EQ(l.e2e_ms->p50, 500);
  EXPECT_DOUBLE_EQ(l.e2e_ms->mean, 1150.0 / 3);
  EXPECT_TRUE(l.all_tokens_counted_by_server);

  const nlohmann::json j = to_json({}, {l});
  const nlohmann::json& r = j["results"][0];
  EXPECT_EQ(r["concurrency"], 4);
  EXPECT_EQ(r["ttft_ms_p50"], 50.0);
  EXPECT_EQ(r["itl_ms_mean"], 75.0);
  EXPECT_EQ(r["e2e_latency_ms_p50"], 500.0);
  EXPECT_EQ(r["completed"], 3);
  EXPECT_EQ(r["errors"], 2);
  EXPECT_EQ(r["first_error"], "HTTP 503: first");
  EXPECT_EQ(j["percentiles"], "nearest-rank");
}

TEST(PerfStats, UnstreamedRequestsHaveNoTokenLatencies) {
  const Clock::time_point t0{};
  RequestResult r;
  r.sent = t0 + milliseconds(10);
  r.done = t0 + milliseconds(30);
  r.output_tokens = 16;
  const LevelResult l = aggregate(1, {r}, t0, t0 + milliseconds(100));
  EXPECT_EQ(l.completed, 1);
  EXPECT_FALSE(l.ttft_ms.has_value());
  EXPECT_FALSE(l.itl_ms.has_value());
  EXPECT_DOUBLE_EQ(l.e2e_ms->p50, 20);
  EXPECT_FALSE(l.all_tokens_counted_by_server);
  const nlohmann::json j = to_json({}, {l})["results"][0];
  EXPECT_TRUE(j["ttft_ms_p99"].is_null());
  EXPECT_TRUE(j["itl_ms_p50"].is_null());
  EXPECT_TRUE(j["first_error"].is_null());
  RunDescription run;
  const std::string table = format_table(run, {l});
  EXPECT_NE(table.find("not streamed"), std::string::npos) << table;
  EXPECT_NE(table.find("tokens are the ones asked for"), std::string::npos) << table;
}

// Every way of cutting `stream` into two network reads gives the same events.
std::vector<std::string> events_of(const std::string& stream, size_t cut) {
  std::vector<std::string> events;
  SseParser p([&](const std::string& data) {
    events.push_back(data);
    return true;
  });
  EXPECT_TRUE(p.feed(std::string_view(stream).substr(0, cut)));
  EXPECT_TRUE(p.feed(std::string_view(stream).substr(cut)));
  EXPECT_TRUE(p.finish());
  return events;
}

TEST(PerfSse, EventsSplitAcrossReads) {
  const std::vector<std::string> want = {"{\"text\":\"a\"}", "line one\nline two", "x", "[DONE]"};
  for (const std::string eol : {"\n", "\r\n", "\r"}) {
    const std::string stream = ": keep-alive comment" + eol + "data: {\"text\":\"a\"}" + eol + eol +
                               "event: message" + eol + "data: line one" + eol + "data: line two" +
                               eol + "id: 7" + eol + eol + eol + "data:x" + eol + eol +
                               "data: [DONE]" + eol + eol;
    for (size_t cut = 0; cut <= stream.size(); ++cut)
      EXPECT_EQ(events_of(stream, cut), want) << "cut at " << cut << " with eol "
                                              << (eol == "\n"   ? "LF"
                                                  : eol == "\r" ? "CR"
                                                                : "CRLF");
  }
}

TEST(PerfSse, ByteByByteAndUnterminated) {
  const std::string stream = "data: one\r\n\r\ndata: two\r\n\r\ndata: last";
  std::vector<std::string> events;
  SseParser p([&](const std::string& data) {
    events.push_back(data);
    return true;
  });
  for (const char c : stream) ASSERT_TRUE(p.feed(std::string_view(&c, 1)));
  EXPECT_EQ(events, (std::vector<std::string>{"one", "two"}));
  EXPECT_TRUE(p.finish());  // the server's last words, though it did not end them
  EXPECT_EQ(events, (std::vector<std::string>{"one", "two", "last"}));
}

TEST(PerfSse, StopsWhenTheHandlerSaysSo) {
  int calls = 0;
  SseParser p([&](const std::string&) { return ++calls < 2; });
  EXPECT_FALSE(p.feed("data: a\n\ndata: b\n\ndata: c\n\n"));
  EXPECT_EQ(calls, 2);
}

TEST(PerfRequests, Bodies) {
  Target t;
  t.model = "bloom";
  t.output_len = 7;
  t.stream = true;
  nlohmann::json j = nlohmann::json::parse(request_body(t, "hi"));
  EXPECT_EQ(request_path(t), "/v1/completions");
  EXPECT_EQ(j["model"], "bloom");
  EXPECT_EQ(j["prompt"], "hi");
  EXPECT_EQ(j["max_tokens"], 7);
  EXPECT_EQ(j["temperature"], 0.0);
  EXPECT_EQ(j["stream"], true);
  EXPECT_EQ(j["stream_options"]["include_usage"], true);
  EXPECT_FALSE(j.contains("ignore_eos"));
  t.protocol = Protocol::kKserve;
  t.model = "my model/1";
  t.base_path = "/api";
  t.ignore_eos = true;
  EXPECT_EQ(request_path(t), "/api/v2/models/my%20model%2F1/generate_stream");
  j = nlohmann::json::parse(request_body(t, "hi"));
  EXPECT_EQ(j["text_input"], "hi");
  EXPECT_EQ(j["parameters"]["max_tokens"], 7);
  EXPECT_EQ(j["parameters"]["return_token_ids"], true);
  EXPECT_EQ(j["parameters"]["ignore_eos"], true);
  t.stream = false;
  EXPECT_EQ(request_path(t), "/api/v2/models/my%20model%2F1/generate");
}

TEST(PerfRequests, Urls) {
  Target t;
  parse_url("http://localhost:8000", t);
  EXPECT_EQ(t.scheme_host_port, "http://localhost:8000");
  EXPECT_EQ(t.base_path, "");
  parse_url("localhost:8000/prefix/", t);
  EXPECT_EQ(t.scheme_host_port, "http://localhost:8000");
  EXPECT_EQ(t.base_path, "/prefix");
  parse_url("https://example.com", t);
  EXPECT_EQ(t.scheme_host_port, "https://example.com");
  for (const char* bad : {"ftp://x:1", "http://", "http://host:99999", "http://host:x", ":80"})
    EXPECT_THROW(parse_url(bad, t), kiln::Error) << bad;
}

}  // namespace
}  // namespace kiln::cli::perf
