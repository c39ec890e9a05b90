// Prometheus' text exposition format, version 0.0.4 (what Triton's /metrics speaks): a metric
// family is a "# HELP" and a "# TYPE" line followed by all its samples, together; label values
// escape backslash, double quote and newline; HELP text escapes backslash and newline.
// A family's lines must not be split across the page (Prometheus rejects a family that appears
// twice), so renderers write one family at a time over every model or GPU.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln {
struct Histogram;
}

namespace kiln::server {

using Labels = std::vector<std::pair<std::string, std::string>>;

std::string escape_label_value(std::string_view value);
std::string escape_help(std::string_view text);
// A sample value as Prometheus parses it: integers exactly, other numbers in their shortest
// round-trip form, "+Inf", "-Inf", "NaN".
std::string format_value(double value);

enum class MetricType { kCounter, kGauge, kHistogram };

class Exposition {
 public:
  void family(std::string_view name, MetricType type, std::string_view help);
  void sample(std::string_view name, const Labels& labels, int64_t value);
  void sample(std::string_view name, const Labels& labels, double value);
  // name_bucket{...,le="b"} per bound, cumulative, then le="+Inf" (= count), name_sum and
  // name_count. Histogram keeps per-bucket counts; Prometheus wants each bucket to count every
  // observation at or below its bound.
  void histogram(std::string_view name, const Labels& labels, const Histogram& h);
  const std::string& text() const { return text_; }
  std::string take() { return std::move(text_); }

 private:
  void series(std::string_view name, const Labels& labels, const std::string* le);
  std::string text_;
};

}  // namespace kiln::server
