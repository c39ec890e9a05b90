#include "server/exposition.h"

#include <cmath>

#include <fmt/format.h>

#include "runtime/generation_executor.h"

namespace kiln::server {

std::string escape_label_value(std::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '"')
      out += "\\\"";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string escape_help(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\')
      out += "\\\\";
    else if (c == '\n')
      out += "\\n";
    else
      out += c;
  }
  return out;
}

std::string format_value(double value) {
  if (std::isnan(value)) return "NaN";
  if (std::isinf(value)) return value > 0 ? "+Inf" : "-Inf";
  // Whole numbers below 2^53 print without an exponent or ".0" (1e+06 parses, but reads badly
  // next to Triton's integer counters).
  if (value == std::floor(value) && std::fabs(value) < 9007199254740992.0)
    return fmt::format("{}", static_cast<int64_t>(value));
  return fmt::format("{}", value);
}

void Exposition::family(std::string_view name, MetricType type, std::string_view help) {
  const char* t = "gauge";
  switch (type) {
    case MetricType::kCounter:
      t = "counter";
      break;
    case MetricType::kGauge:
      t = "gauge";
      break;
    case MetricType::kHistogram:
      t = "histogram";
      break;
  }
  fmt::format_to(std::back_inserter(text_), "# HELP {} {}\n# TYPE {} {}\n", name, escape_help(help),
                 name, t);
}

void Exposition::series(std::string_view name, const Labels& labels, const std::string* le) {
  text_ += name;
  if (labels.empty() && le == nullptr) {
    text_ += ' ';
    return;
  }
  text_ += '{';
  bool first = true;
  for (const auto& [key, value] : labels) {
    if (!first) text_ += ',';
    first = false;
    fmt::format_to(std::back_inserter(text_), "{}=\"{}\"", key, escape_label_value(value));
  }
  if (le != nullptr)
    fmt::format_to(std::back_inserter(text_), "{}le=\"{}\"", first ? "" : ",", *le);
  text_ += "} ";
}

void Exposition::sample(std::string_view name, const Labels& labels, int64_t value) {
  series(name, labels, nullptr);
  fmt::format_to(std::back_inserter(text_), "{}\n", value);
}

void Exposition::sample(std::string_view name, const Labels& labels, double value) {
  series(name, labels, nullptr);
  text_ += format_value(value);
  text_ += '\n';
}

void Exposition::histogram(std::string_view name, const Labels& labels, const Histogram& h) {
  const std::string bucket = std::string(name) + "_bucket";
  int64_t cumulative = 0;
  for (size_t i = 0; i < h.bounds.size(); ++i) {
    if (i < h.buckets.size()) cumulative += h.buckets[i];
    const std::string le = format_value(h.bounds[i]);
    series(bucket, labels, &le);
    fmt::format_to(std::back_inserter(text_), "{}\n", cumulative);
  }
  // +Inf counts everything, the overflow bucket included: the same number as _count, which
  // Prometheus' histogram_quantile() relies on.
  const std::string inf = "+Inf";
  series(bucket, labels, &inf);
  fmt::format_to(std::back_inserter(text_), "{}\n", h.count);
  series(std::string(name) + "_sum", labels, nullptr);
  text_ += format_value(h.sum);
  text_ += '\n';
  series(std::string(name) + "_count", labels, nullptr);
  fmt::format_to(std::back_inserter(text_), "{}\n", h.count);
}

}  // namespace kiln::server
