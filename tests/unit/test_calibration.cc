// INT8 calibration's arithmetic (passes/calibrator.h) on distributions whose answers are known by
// hand, and the calibration cache (passes/calibration_cache.h). The runner over the fixture
// models is test_calibration_runner.cc; bad inputs (prompts, caches) test_calibration_bad_input.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <vector>

#include "passes/calibration_cache.h"
#include "passes/calibrator.h"

namespace kiln::test {
namespace {

TEST(Calibrator, MinMaxIsTheLargestMagnitudeExactly) {
  AbsHistogram h(64);
  const std::vector<float> a = {0.25f, -1.5f, 0.0f, 3.0f};
  const std::vector<float> b = {-7.125f, 2.0f};
  h.add(a);
  h.add(b);
  const CalibratedRange r = calibrate_minmax(h);
  EXPECT_EQ(r.threshold, 7.125);
  EXPECT_EQ(r.scale, 7.125 / 127.0);
  EXPECT_EQ(h.count(), 6);
}

TEST(Calibrator, ALargerMaximumRebinsWithoutSplittingCounts) {
  AbsHistogram h(8);
  const std::vector<float> first = {0.3f, 0.9f};  // range 0.9, width 0.1125
  h.add(first);
  EXPECT_DOUBLE_EQ(h.range(), 0.9f);
  const std::vector<float> second = {-3.0f};  // range doubles twice: 3.6, width 0.45
  h.add(second);
  EXPECT_DOUBLE_EQ(h.range(), 4 * static_cast<double>(0.9f));
  EXPECT_EQ(h.amax(), 3.0);
  EXPECT_EQ(h.count(), 3);
  // 0.3 (old bin 2) and 0.9 (old bin 7, the last) merge into new bins 0 and 1; 3.0 is bin 6.
  EXPECT_EQ(h.counts(), (std::vector<int64_t>{1, 1, 0, 0, 0, 0, 1, 0}));
  // Zeros before any non-zero value stay in bin 0 when the range is set.
  AbsHistogram z(4);
  const std::vector<float> zeros = {0.0f, -0.0f};
  z.add(zeros);
  EXPECT_EQ(z.range(), 0.0);
  const std::vector<float> one = {1.0f};
  z.add(one);
  EXPECT_EQ(z.counts(), (std::vector<int64_t>{2, 0, 0, 1}));
  EXPECT_EQ(calibrate_minmax(AbsHistogram(4)).scale, 0.0) << "never non-zero: scale 0";
}

TEST(Calibrator, ANonFiniteValueIsAnError) {
  AbsHistogram h;
  const std::vector<float> bad = {1.0f, NAN};
  EXPECT_THROW(h.add(bad), Error);
}

// Uniform values: 1000 bins of width 1 over [0, 1000] (the first value fixes the range), one
// value at each bin centre k + 0.5 for k = 0..998 and 1000 itself in the last bin. The p-th
// percentile of 1000 values is reached in the bin holding the (10 p)-th smallest value, k + 0.5
// with k = 10 p - 1; its upper edge is 10 p.
TEST(Calibrator, PercentileOfUniformValuesIsTheQuantileBinsUpperEdge) {
  AbsHistogram h(1000);
  const std::vector<float> top = {1000.0f};
  h.add(top);
  std::vector<float> body;
  for (int k = 0; k < 999; ++k) body.push_back(static_cast<float>(k) + 0.5f);
  h.add(body);
  ASSERT_EQ(h.count(), 1000);
  ASSERT_DOUBLE_EQ(h.bin_width(), 1.0);
  EXPECT_DOUBLE_EQ(calibrate_percentile(h, 99.0).threshold, 990.0);  // the 990th value: 989.5
  EXPECT_DOUBLE_EQ(calibrate_percentile(h, 50.0).threshold, 500.0);
  EXPECT_DOUBLE_EQ(calibrate_percentile(h, 99.95).threshold, 1000.0);  // 999.5 values: the max
  EXPECT_DOUBLE_EQ(calibrate_percentile(h, 100.0).threshold, 1000.0);
  EXPECT_DOUBLE_EQ(calibrate_percentile(h, 99.0).scale, 990.0 / 127.0);
  EXPECT_EQ(calibrate(h, parse_calibration_method("percentile:50")).threshold, 500.0);
}

// A worked example of TensorRT's method with 2 levels over 6 bins of width 1:
//   counts [6, 2, 1, 0, 0, 1], amax 5.5. Candidates i = 2..6:
//   i=2: P = [6, 2+1+0+0+1] / 10 = [.6, .4]; Q merges bins [0,2) into 2 groups of 1: [6, 2] / 8
//        = [.75, .25]; KL = .6 ln(.6/.75) + .4 ln(.4/.25) = -.13389 + .18800 = .054115
//   i=3: P = [6, 2, 1+1] / 10 = [.6, .2, .2]; groups {0} and {1, 2} (the last takes the
//        remainder): [6], [2+1 over 2 non-empty bins] -> Q = [6, 1.5, 1.5] / 9;
//        KL = .6 ln(.6/.6667) + 2 (.2 ln(.2/.16667)) = -.063216 + .072929 = .009712
//   i=4: P = [6, 2, 1, 0+1]; groups {0,1} -> 4, 4 and {2,3} -> 1 on bin 2 only: Q[3] = 0 < P[3]:
//        infinite
//   i=5: likewise Q[4] = 0 < P[4]: infinite
//   i=6: P = [6,2,1,0,0,1] / 10; groups {0,1,2} -> 3, 3, 3 and {3,4,5} -> 1 on bin 5:
//        KL = .6 ln 2 + .2 ln(2/3) + .1 ln(1/3) + .1 ln 1 = .224934
//   The smallest is i = 3: threshold 3 (< amax 5.5), scale 3 / 127.
TEST(Calibrator, EntropyMatchesAWorkedExample) {
  const AbsHistogram h = AbsHistogram::from_counts({6, 2, 1, 0, 0, 1}, 6.0, 5.5);
  EXPECT_NEAR(entropy_divergence(h, 2, 2), 0.0541153209, 1e-9);
  EXPECT_NEAR(entropy_divergence(h, 3, 2), 0.0097123133, 1e-9);
  EXPECT_TRUE(std::isinf(entropy_divergence(h, 4, 2)));
  EXPECT_TRUE(std::isinf(entropy_divergence(h, 5, 2)));
  EXPECT_NEAR(entropy_divergence(h, 6, 2), 0.2249340578, 1e-9);
  const CalibratedRange r = calibrate_entropy(h, 2);
  EXPECT_DOUBLE_EQ(r.threshold, 3.0);
  EXPECT_DOUBLE_EQ(r.scale, 3.0 / 127.0);
}

// A gaussian body (sigma 1) with a few huge outliers: min-max spends the int8 range on the
// outliers; entropy clips them, keeping the threshold well above the body's bulk.
TEST(Calibrator, EntropyClipsTheOutliersOfALongTail) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(200000);
  for (float& v : x) v = normal(rng);
  for (int i = 0; i < 5; ++i) x[static_cast<size_t>(i) * 1000] = 60.0f + static_cast<float>(i);
  AbsHistogram h;
  h.add(x);
  const CalibratedRange minmax = calibrate_minmax(h);
  const CalibratedRange entropy = calibrate(h, parse_calibration_method("entropy"));
  EXPECT_EQ(minmax.threshold, 64.0);
  EXPECT_LT(entropy.threshold, 0.25 * minmax.threshold) << "the outliers are clipped";
  EXPECT_GT(entropy.threshold, 2.5) << "the body (|x| < 2.5 for 99% of it) is not";
  EXPECT_DOUBLE_EQ(entropy.scale, entropy.threshold / 127.0);
  // Without outliers nothing needs clipping far below the max.
  const CalibratedRange p = calibrate_percentile(h, 99.99);
  EXPECT_LT(p.threshold, minmax.threshold);
}

TEST(Calibrator, MethodNamesRoundTrip) {
  for (const char* name : {"entropy", "minmax", "percentile:99.99", "percentile:100"})
    EXPECT_EQ(calibration_method_name(parse_calibration_method(name)), name);
  for (const char* bad :
       {"", "kl", "percentile", "percentile:", "percentile:0", "percentile:101", "percentile:9x"})
    EXPECT_THROW(parse_calibration_method(bad), Error) << bad;
}

std::string temp_path(const std::string& name) {
  std::filesystem::create_directories(KILN_TEST_TMP);
  return std::string(KILN_TEST_TMP) + "/" + name;
}

TEST(CalibCache, RoundTripsEveryScaleExactly) {
  CalibrationCache cache;
  cache.model = "0123456789abcdef";
  cache.method = "percentile:99.99";
  cache.scales = {{"encoder/x", 0.1f},
                  {"decoder/h.0", 1.0f / 3.0f},
                  {"decoder/tiny", 1.17549435e-38f},
                  {"decoder/zero", 0.0f},
                  {"decoder/big", 3.4e38f}};
  const std::string path = temp_path("calib_roundtrip.cache");
  write_calibration_cache(path, cache);
  EXPECT_EQ(read_calibration_cache(path), cache);
  EXPECT_NO_THROW(check_calibration_cache(
      cache, path, cache.model,
      {"encoder/x", "decoder/h.0", "decoder/tiny", "decoder/zero", "decoder/big"}));
}

// An AWQ cache (method awq, version 4): the factors alone, read back exactly.
TEST(CalibCache, AnAwqCacheRoundTripsItsFactors) {
  CalibrationCache cache;
  cache.model = "0123456789abcdef";
  cache.method = CalibrationCache::kAwqMethod;
  cache.smoothing = {{"encoder/x", {0.5f, 1.0f / 3.0f, 7.25f}}, {"decoder/y", {2.0f}}};
  const std::string path = temp_path("calib_awq.cache");
  write_calibration_cache(path, cache);
  const CalibrationCache back = read_calibration_cache(path);
  EXPECT_EQ(back, cache);
  EXPECT_TRUE(back.awq());
  std::ifstream in(path);
  std::string first;
  std::getline(in, first);
  EXPECT_EQ(first, "kiln-calibration-cache 4 model=0123456789abcdef method=awq");
  // Nothing but factors: a scale makes it another kind of cache.
  cache.scales["encoder/x"] = 0.5f;
  EXPECT_THROW(write_calibration_cache(temp_path("calib_awq_bad.cache"), cache), Error);
}

}  // namespace
}  // namespace kiln::test
