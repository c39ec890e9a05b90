// INT8 calibration's arithmetic: a histogram of |x| per calibrated tensor, and the calibrators
// that turn it into a symmetric int8 scale (scale = threshold / 127, values beyond the threshold
// clip): min-max (the largest |x| seen), percentile (the |x| below which a given fraction of the
// values lie) and entropy (TensorRT's KL-divergence threshold search). Plain numbers in, plain
// numbers out: nothing here knows about graphs, models or files (the runner that fills the
// histograms is builder/calibration_runner.h, the cache calibration_cache.h).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kiln {

// Counts of |x| over `bins()` equal bins covering [0, range()]; the largest |x| is kept exactly
// (amax()). The range starts at the first non-zero |x| seen and, when a larger one arrives,
// doubles as often as needed, each new bin the sum of 2, 4, ... old ones: rebinning never
// splits a count, so the histogram is exactly what fixed bins over the final range would hold
// (at a resolution of range / bins, range < 2 amax).
class AbsHistogram {
 public:
  static constexpr int kDefaultBins = 2048;  // TensorRT's
  explicit AbsHistogram(int bins = kDefaultBins);
  // A histogram given bin by bin (tests, and worked examples): `counts` over [0, range], of
  // which `amax` (<= range, > range - range / bins unless every count is in bin 0) is the largest
  // value. Throws when they disagree.
  static AbsHistogram from_counts(std::vector<int64_t> counts, double range, double amax);

  // Adds |v| of every value. A NaN or an infinity is an error (the caller names the tensor).
  void add(std::span<const float> values);

  int bins() const { return static_cast<int>(counts_.size()); }
  const std::vector<int64_t>& counts() const { return counts_; }
  double range() const { return range_; }  // 0 while every value seen is 0
  double bin_width() const { return range_ / static_cast<double>(counts_.size()); }
  double amax() const { return amax_; }
  int64_t count() const { return total_; }

 private:
  void grow_to(double amax);

  std::vector<int64_t> counts_;
  double range_ = 0.0;
  double amax_ = 0.0;
  int64_t total_ = 0;
};

enum class CalibrationMethod : uint8_t { kEntropy, kMinMax, kPercentile };

struct CalibrationMethodSpec {
  CalibrationMethod method = CalibrationMethod::kEntropy;
  double percentile = 99.99;  // kPercentile only: in (0, 100]
  bool operator==(const CalibrationMethodSpec&) const = default;
};
// "entropy", "minmax" or "percentile:P" (P in (0, 100], e.g. 99.99); a usage error naming the
// forms otherwise.
CalibrationMethodSpec parse_calibration_method(std::string_view text);
// The inverse of parse_calibration_method ("percentile:99.99"): what the cache header records.
std::string calibration_method_name(const CalibrationMethodSpec& spec);

// A calibrated tensor: values of |x| above `threshold` clip; int8 q = round(x / scale).
struct CalibratedRange {
  double threshold = 0.0;
  double scale = 0.0;  // threshold / 127; 0 for a tensor that was always 0
};
inline constexpr int kInt8Levels = 127;

// threshold = amax: nothing clips.
CalibratedRange calibrate_minmax(const AbsHistogram& h);
// threshold = the upper edge of the first bin at which the cumulative count reaches
// `percentile`% of all values (at most amax): the smallest edge with that share of the values at
// or below it, as far as the bins tell.
CalibratedRange calibrate_percentile(const AbsHistogram& h, double percentile);
// TensorRT's entropy calibration (Migacz, "8-bit Inference with TensorRT", GTC 2017). For each
// candidate i from `levels` to the bins in use: P = bins[0, i) with the outliers (bins i..)
// added to bin i-1; Q = bins[0, i) (without the outliers) merged into `levels` groups of i /
// levels bins (the last group takes the remainder), each group's count spread evenly over its
// non-empty bins; both normalised; KL(P || Q) = sum over P > 0 of P log(P / Q), infinite where
// P > 0 = Q (the last bin empty while outliers exist: that candidate is never chosen). The
// threshold is the upper edge of bin i-1 of the smallest divergence (the first, on ties), at
// most amax. `levels` is 128 for int8 (the positive half of its range); tests use fewer.
CalibratedRange calibrate_entropy(const AbsHistogram& h, int levels = 128);
// KL(P || Q) of candidate `i` as calibrate_entropy computes it (exposed for worked examples).
double entropy_divergence(const AbsHistogram& h, int i, int levels);
CalibratedRange calibrate(const AbsHistogram& h, const CalibrationMethodSpec& spec);

}  // namespace kiln
