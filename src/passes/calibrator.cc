#include "passes/calibrator.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>

#include "core/status.h"

namespace kiln {

AbsHistogram::AbsHistogram(int bins) {
  KILN_CHECK(bins > 0, "a calibration histogram needs at least one bin, got {}", bins);
  counts_.assign(static_cast<size_t>(bins), 0);
}

AbsHistogram AbsHistogram::from_counts(std::vector<int64_t> counts, double range, double amax) {
  KILN_CHECK(!counts.empty(), "a calibration histogram needs at least one bin");
  KILN_CHECK(range >= 0 && amax >= 0 && amax <= range, "histogram: amax {} outside [0, range {}]",
             amax, range);
  AbsHistogram h(static_cast<int>(counts.size()));
  h.counts_ = std::move(counts);
  h.range_ = range;
  h.amax_ = amax;
  for (int64_t c : h.counts_) {
    KILN_CHECK(c >= 0, "histogram: a negative count {}", c);
    h.total_ += c;
  }
  return h;
}

void AbsHistogram::grow_to(double amax) {
  if (range_ == 0.0) {  // every count so far is a zero, in bin 0 whatever the range
    range_ = amax;
    return;
  }
  int64_t factor = 1;
  while (range_ * static_cast<double>(factor) < amax) factor *= 2;
  if (factor == 1) return;
  const size_t bins = counts_.size();
  std::vector<int64_t> merged(bins, 0);
  for (size_t i = 0; i < bins; ++i) merged[i / static_cast<size_t>(factor)] += counts_[i];
  counts_ = std::move(merged);
  range_ *= static_cast<double>(factor);
}

void AbsHistogram::add(std::span<const float> values) {
  double batch_max = 0.0;
  for (float v : values) {
    KILN_CHECK(std::isfinite(v), "a calibration value is {} (not finite)", v);
    batch_max = std::max(batch_max, static_cast<double>(std::fabs(v)));
  }
  if (batch_max > range_) grow_to(batch_max);
  amax_ = std::max(amax_, batch_max);
  const int64_t bins = static_cast<int64_t>(counts_.size());
  const double per_unit = range_ > 0.0 ? static_cast<double>(bins) / range_ : 0.0;
  for (float v : values) {
    const int64_t b = static_cast<int64_t>(std::fabs(static_cast<double>(v)) * per_unit);
    ++counts_[static_cast<size_t>(std::min(b, bins - 1))];
  }
  total_ += static_cast<int64_t>(values.size());
}

CalibrationMethodSpec parse_calibration_method(std::string_view text) {
  if (text == "entropy") return {CalibrationMethod::kEntropy};
  if (text == "minmax") return {CalibrationMethod::kMinMax};
  constexpr std::string_view kPercentile = "percentile:";
  if (text.substr(0, kPercentile.size()) == kPercentile) {
    const std::string_view number = text.substr(kPercentile.size());
    double p = 0.0;
    const auto [end, ec] = std::from_chars(number.data(), number.data() + number.size(), p);
    KILN_CHECK_USAGE(
        ec == std::errc() && end == number.data() + number.size() && p > 0.0 && p <= 100.0,
        "calibration method '{}': the percentile must be a number in (0, 100], "
        "e.g. percentile:99.99",
        text);
    return {CalibrationMethod::kPercentile, p};
  }
  KILN_FAIL_KIND(ErrorKind::kUsage,
                 "unknown calibration method '{}': expected entropy, minmax or percentile:P "
                 "(e.g. percentile:99.99)",
                 text);
}

std::string calibration_method_name(const CalibrationMethodSpec& spec) {
  switch (spec.method) {
    case CalibrationMethod::kEntropy:
      return "entropy";
    case CalibrationMethod::kMinMax:
      return "minmax";
    case CalibrationMethod::kPercentile:
      return fmt::format("percentile:{}", spec.percentile);
  }
  KILN_FAIL("unknown calibration method {}", static_cast<int>(spec.method));
}

namespace {

CalibratedRange range_of(double threshold) {
  return {threshold, threshold / static_cast<double>(kInt8Levels)};
}

// One past the last non-empty bin (0 for an empty histogram).
int bins_in_use(const AbsHistogram& h) {
  const std::vector<int64_t>& c = h.counts();
  int used = static_cast<int>(c.size());
  while (used > 0 && c[static_cast<size_t>(used - 1)] == 0) --used;
  return used;
}

}  // namespace

CalibratedRange calibrate_minmax(const AbsHistogram& h) { return range_of(h.amax()); }

CalibratedRange calibrate_percentile(const AbsHistogram& h, double percentile) {
  KILN_CHECK_USAGE(percentile > 0.0 && percentile <= 100.0, "percentile {} is outside (0, 100]",
                   percentile);
  if (h.count() == 0 || h.range() == 0.0) return range_of(h.amax());
  const double wanted = percentile / 100.0 * static_cast<double>(h.count());
  int64_t cumulative = 0;
  for (int i = 0; i < h.bins(); ++i) {
    cumulative += h.counts()[static_cast<size_t>(i)];
    if (static_cast<double>(cumulative) >= wanted)
      return range_of(std::min(h.amax(), (i + 1) * h.bin_width()));
  }
  return range_of(h.amax());
}

double entropy_divergence(const AbsHistogram& h, int i, int levels) {
  KILN_CHECK(levels > 0 && i >= levels && i <= h.bins(),
             "entropy calibration: candidate {} outside [{}, {}]", i, levels, h.bins());
  const std::vector<int64_t>& bins = h.counts();
  const size_t n = static_cast<size_t>(i);
  // P: the first i bins, the outliers added to the last of them.
  std::vector<double> p(bins.begin(), bins.begin() + i);
  for (size_t b = n; b < bins.size(); ++b) p[n - 1] += static_cast<double>(bins[b]);
  // Q: the first i bins (no outliers) merged into `levels` groups and spread back evenly over
  // each group's non-empty bins.
  std::vector<double> q(n, 0.0);
  const size_t merged = n / static_cast<size_t>(levels);
  for (size_t level = 0; level < static_cast<size_t>(levels); ++level) {
    const size_t start = level * merged;
    const size_t stop = level + 1 == static_cast<size_t>(levels) ? n : start + merged;
    double sum = 0.0;
    int nonzero = 0;
    for (size_t b = start; b < stop; ++b) {
      sum += static_cast<double>(bins[b]);
      nonzero += bins[b] != 0;
    }
    if (nonzero == 0) continue;
    for (size_t b = start; b < stop; ++b)
      if (bins[b] != 0) q[b] = sum / nonzero;
  }
  double p_total = 0.0, q_total = 0.0;
  for (size_t b = 0; b < n; ++b) {
    p_total += p[b];
    q_total += q[b];
  }
  if (p_total == 0.0) return 0.0;
  if (q_total == 0.0) return std::numeric_limits<double>::infinity();
  double kl = 0.0;
  for (size_t b = 0; b < n; ++b) {
    if (p[b] == 0.0) continue;
    if (q[b] == 0.0) return std::numeric_limits<double>::infinity();
    const double pn = p[b] / p_total, qn = q[b] / q_total;
    kl += pn * std::log(pn / qn);
  }
  return kl;
}

CalibratedRange calibrate_entropy(const AbsHistogram& h, int levels) {
  KILN_CHECK(levels > 0, "entropy calibration needs at least one level, got {}", levels);
  const int used = bins_in_use(h);
  // Nothing to clip when every value fits below the first candidate (or the histogram is too
  // small to hold `levels` bins).
  if (h.range() == 0.0 || used <= levels || h.bins() < levels) return range_of(h.amax());
  double best = std::numeric_limits<double>::infinity();
  int best_i = used;
  // Beyond the last non-empty bin P and Q no longer change: `used` is the last candidate.
  for (int i = levels; i <= used; ++i) {
    const double kl = entropy_divergence(h, i, levels);
    if (kl < best) {
      best = kl;
      best_i = i;
    }
  }
  return range_of(std::min(h.amax(), best_i * h.bin_width()));
}

CalibratedRange calibrate(const AbsHistogram& h, const CalibrationMethodSpec& spec) {
  switch (spec.method) {
    case CalibrationMethod::kEntropy:
      return calibrate_entropy(h);
    case CalibrationMethod::kMinMax:
      return calibrate_minmax(h);
    case CalibrationMethod::kPercentile:
      return calibrate_percentile(h, spec.percentile);
  }
  KILN_FAIL("unknown calibration method {}", static_cast<int>(spec.method));
}

}  // namespace kiln
