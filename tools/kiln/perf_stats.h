// kiln perf's measurements: what one request took, and the statistics of a concurrency level
// (nearest-rank percentiles, rates over the measurement window) as a table or JSON.
#pragma once

#include <chrono>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace kiln::cli::perf {

using Clock = std::chrono::steady_clock;

// One request as the client saw it. Streamed requests know when their output arrived; for a
// request answered in one piece only `sent` and `done` are known (no TTFT, no inter-token
// latency).
struct RequestResult {
  Clock::time_point sent, done;
  // The first and the last event that carried output (text or token ids).
  std::optional<Clock::time_point> first_token, last_token;
  int64_t output_tokens = 0;
  // False when the server reported no token count (no usage, no token_ids) and output_tokens
  // counts stream events or, answered in one piece, is the requested length.
  bool tokens_counted_by_server = false;
  std::string error;         // empty: the request succeeded
  bool unreachable = false;  // no connection could be made (refused, timed out, bad host)
};

// The p-th percentile (0 < p <= 100) by the nearest-rank method: the smallest value with at least
// p % of the values at or below it, i.e. sorted[ceil(p / 100 * n) - 1]. Always one of the
// values, never an interpolation. `values` must not be empty.
double percentile(std::vector<double> values, double p);

struct Summary {
  double p50 = 0, p90 = 0, p99 = 0, mean = 0;
};
// Nothing for no values.
std::optional<Summary> summarize(const std::vector<double>& values);

// The results of one concurrency level over its measurement window.
struct LevelResult {
  int concurrency = 0;
  double window_s = 0;
  int64_t completed = 0, errors = 0;
  std::string first_error;  // of the errors in the window, the one that ended first
  int64_t output_tokens = 0;
  bool all_tokens_counted_by_server = true;
  double requests_per_s = 0, output_tokens_per_s = 0;
  std::optional<Summary> ttft_ms, itl_ms, e2e_ms, output_tokens_per_request;
};

// What perf_analyzer counts: the requests that ended inside [window_start, window_end], whenever
// they started (the load is at its level throughout the window, so a request begun in the warmup
// is as representative as any). Rates are per second of the window. The inter-token latency of a
// request is genai-perf's (last token time - first token time) / (tokens - 1), for streamed
// requests of two or more tokens; TTFT is the first output event's time after sending.
LevelResult aggregate(int concurrency, const std::vector<RequestResult>& requests,
                      Clock::time_point window_start, Clock::time_point window_end);

// What the run was: the header of the table and the top of the JSON object.
struct RunDescription {
  std::string url, model, protocol, prompts;  // prompts: "about N words" or the file
  bool stream = false;
  int64_t output_len = 0;
  double duration_s = 0, warmup_s = 0;
};

// {"url", "model", ..., "results": [{"concurrency", "requests_per_s", "ttft_ms_p99", ...}]};
// latencies that were not measured (TTFT and ITL of requests not streamed) are null.
nlohmann::json to_json(const RunDescription& run, const std::vector<LevelResult>& levels);
// The table: a line saying what was run, then a block per concurrency level (rates and counts,
// then a p50/p90/p99/mean row per latency), which format_level() makes alone (to print each level
// as soon as it is done).
std::string format_header(const RunDescription& run);
std::string format_level(const RunDescription& run, const LevelResult& level);
std::string format_table(const RunDescription& run, const std::vector<LevelResult>& levels);

}  // namespace kiln::cli::perf
