#include "perf_stats.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <stdexcept>

namespace kiln::cli::perf {
namespace {

double ms_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::milli>(b - a).count();
}

}  // namespace

double percentile(std::vector<double> values, double p) {
  if (values.empty() || !(p > 0.0 && p <= 100.0))
    throw std::invalid_argument("percentile: no values, or p outside (0, 100]");
  std::sort(values.begin(), values.end());
  // The rank is computed in integers where it can be: ceil(0.9 * 10) in doubles is 10, not 9,
  // when 0.9 * 10 rounds to 9.000000000000002.
  const double exact = p * static_cast<double>(values.size()) / 100.0;
  auto rank = static_cast<size_t>(std::ceil(exact - 1e-9));
  rank = std::clamp<size_t>(rank, 1, values.size());
  return values[rank - 1];
}

std::optional<Summary> summarize(const std::vector<double>& values) {
  if (values.empty()) return std::nullopt;
  Summary s;
  s.p50 = percentile(values, 50);
  s.p90 = percentile(values, 90);
  s.p99 = percentile(values, 99);
  s.mean = std::accumulate(values.begin(), values.end(), 0.0) / static_cast<double>(values.size());
  return s;
}

LevelResult aggregate(int concurrency, const std::vector<RequestResult>& requests,
                      Clock::time_point window_start, Clock::time_point window_end) {
  LevelResult r;
  r.concurrency = concurrency;
  r.window_s = std::chrono::duration<double>(window_end - window_start).count();
  std::vector<double> ttft, itl, e2e, tokens;
  std::optional<Clock::time_point> first_error_at;
  for (const RequestResult& q : requests) {
    if (q.done < window_start || q.done > window_end) continue;
    if (!q.error.empty()) {
      ++r.errors;
      if (!first_error_at || q.done < *first_error_at) {
        first_error_at = q.done;
        r.first_error = q.error;
      }
      continue;
    }
    ++r.completed;
    r.output_tokens += q.output_tokens;
    r.all_tokens_counted_by_server &= q.tokens_counted_by_server;
    tokens.push_back(static_cast<double>(q.output_tokens));
    e2e.push_back(ms_between(q.sent, q.done));
    if (q.first_token) ttft.push_back(ms_between(q.sent, *q.first_token));
    if (q.first_token && q.last_token && q.output_tokens >= 2)
      itl.push_back(ms_between(*q.first_token, *q.last_token) /
                    static_cast<double>(q.output_tokens - 1));
  }
  if (r.window_s > 0) {
    r.requests_per_s = static_cast<double>(r.completed) / r.window_s;
    r.output_tokens_per_s = static_cast<double>(r.output_tokens) / r.window_s;
  }
  r.ttft_ms = summarize(ttft);
  r.itl_ms = summarize(itl);
  r.e2e_ms = summarize(e2e);
  r.output_tokens_per_request = summarize(tokens);
  return r;
}

nlohmann::json to_json(const RunDescription& run, const std::vector<LevelResult>& levels) {
  nlohmann::json results = nlohmann::json::array();
  for (const LevelResult& l : levels) {
    nlohmann::json j{{"concurrency", l.concurrency},
                     {"window_s", l.window_s},
                     {"completed", l.completed},
                     {"errors", l.errors},
                     {"first_error", l.first_error.empty() ? nlohmann::json(nullptr)
                                                           : nlohmann::json(l.first_error)},
                     {"requests_per_s", l.requests_per_s},
                     {"output_tokens", l.output_tokens},
                     {"output_tokens_per_s", l.output_tokens_per_s},
                     {"output_tokens_counted_by_server", l.all_tokens_counted_by_server}};
    auto put = [&](const std::string& name, const std::optional<Summary>& s) {
      const std::pair<const char*, double Summary::*> fields[] = {{"p50", &Summary::p50},
                                                                  {"p90", &Summary::p90},
                                                                  {"p99", &Summary::p99},
                                                                  {"mean", &Summary::mean}};
      for (const auto& [suffix, member] : fields)
        j[name + "_" + suffix] = s ? nlohmann::json((*s).*member) : nlohmann::json(nullptr);
    };
    put("ttft_ms", l.ttft_ms);
    put("itl_ms", l.itl_ms);
    put("e2e_latency_ms", l.e2e_ms);
    put("output_tokens_per_request", l.output_tokens_per_request);
    results.push_back(j);
  }
  return {{"url", run.url},
          {"model", run.model},
          {"protocol", run.protocol},
          {"stream", run.stream},
          {"prompts", run.prompts},
          {"output_len", run.output_len},
          {"duration_s", run.duration_s},
          {"warmup_s", run.warmup_s},
          {"percentiles", "nearest-rank"},
          {"results", results}};
}

std::string format_header(const RunDescription& run) {
  return fmt::format(
      "{} model {} over {}{}; prompts: {}; {} output tokens asked for a request; {:g} s measured "
      "after {:g} s of warmup per concurrency; percentiles by nearest rank\n",
      run.url, run.model, run.protocol, run.stream ? " (streamed)" : "", run.prompts,
      run.output_len, run.duration_s, run.warmup_s);
}

std::string format_level(const RunDescription& run, const LevelResult& l) {
  auto row = [](const std::string& name, const std::optional<Summary>& s, const char* missing) {
    if (!s) return fmt::format("  {:<24} {}\n", name, missing);
    return fmt::format("  {:<24} {:>10.2f} {:>10.2f} {:>10.2f} {:>10.2f}\n", name, s->p50, s->p90,
                       s->p99, s->mean);
  };
  std::string out = fmt::format(
      "\nconcurrency {}: {:.2f} requests/s, {:.1f} output tokens/s; {} completed, {} errors{}\n",
      l.concurrency, l.requests_per_s, l.output_tokens_per_s, l.completed, l.errors,
      l.errors > 0 ? " (first: " + l.first_error + ")" : "");
  if (l.completed == 0) return out;
  if (!l.all_tokens_counted_by_server)
    out += run.stream ? "  (the server reported no token counts: tokens are stream events)\n"
                      : "  (the server reported no token counts: tokens are the ones asked for)\n";
  out += fmt::format("  {:<24} {:>10} {:>10} {:>10} {:>10}\n", "", "p50", "p90", "p99", "mean");
  const char* unstreamed = "- (not streamed: use --stream)";
  out += row("time to first token ms", l.ttft_ms, run.stream ? "-" : unstreamed);
  out += row("inter-token latency ms", l.itl_ms,
             run.stream ? "- (no request had 2 or more tokens)" : unstreamed);
  out += row("end-to-end latency ms", l.e2e_ms, "-");
  out += row("output tokens/request", l.output_tokens_per_request, "-");
  return out;
}

std::string format_table(const RunDescription& run, const std::vector<LevelResult>& levels) {
  std::string out = format_header(run);
  for (const LevelResult& l : levels) out += format_level(run, l);
  return out;
}

}  // namespace kiln::cli::perf
