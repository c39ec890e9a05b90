// The sensitivity fallback of int8 (W8A8) builds (builder/sensitivity.h) on the fixture models
// and on a copy of t5-tiny made sensitive on purpose: a few channels of one norm's output scaled
// up (and its Linears' weight columns scaled down by as much, so the fp32 model computes the
// same function), an outlier that a per-tensor int8 input scale cannot hold. The tolerance
// decides how many layers stay float, the outlier layer is the one kept, the plan records why
// (through a written plan, as `kiln inspect --layers` reads it), a cache-only rebuild keeps the
// same layers, and the fallback plan answers the dev set at least as well as the all-int8 plan.
#include <gtest/gtest.h>

#include <unistd.h>
#include <filesystem>
#include <set>

#include "builder/builder.h"
#include "builder/calibration_runner.h"
#include "builder/sensitivity.h"
#include "io/jsonl.h"
#include "io/safetensors.h"
#include "parity_util.h"
#include "plan/plan.h"
#include "quant_test_util.h"
#include "runtime/scheduler.h"

namespace kiln::test {
namespace {

namespace fs = std::filesystem;

// The layer the outlier copy makes sensitive: kiln's fused q/k/v of encoder block 1, which reads
// the scaled norm's output.
constexpr const char* kSensitiveLayer = "encoder.block.1.layer.0.SelfAttention.qkv";

std::string template_of(const std::string& model_dir) {
  return model_dir.find("bloom") != std::string::npos ? "{prompt} =" : "{prompt}";
}

BuildOptions int8_options(const std::string& dir) {
  BuildOptions o;
  o.precision = Precision::kInt8;
  o.prompt_template = template_of(dir);
  return o;
}

// `dir` calibrated on 64 prompts, with the calibration in the returned options.
BuildOptions calibrated(Context& ctx, const std::string& dir) {
  BuildOptions o = int8_options(dir);
  CalibrationRunOptions run;
  run.batch = 16;
  o.precision_options.calibration = calibrate_checkpoint(ctx, dir, o, calib_prompts(64), run,
                                                         parse_calibration_method("entropy"));
  o.precision_options.calibration_source = "test";
  return o;
}

CalibrationCache fallback(Context& ctx, const std::string& dir, const BuildOptions& o,
                          double tolerance, SensitivityReport* report, int prompts = 12) {
  SensitivityOptions s;
  s.tolerance = tolerance;
  s.prompts = prompts;
  return apply_sensitivity_fallback(ctx, dir, o, calib_prompts(64), s, report);
}

BuildOptions with_cache(BuildOptions o, CalibrationCache cache) {
  o.precision_options.calibration = std::move(cache);
  return o;
}

// The precision note of node `name`, or "".
std::string note_of(const ModelIR& m, const std::string& name) {
  for (const PrecisionNote& n : m.precision_notes)
    if (n.node == name) return n.reason;
  return "";
}

DType weight_dtype(const ModelIR& m, const std::string& name) {
  for (const Graph& g : m.graphs)
    for (const Node& n : g.nodes)
      if (n.name == name) return g.values[n.inputs[n.op == OpKind::kLinear ? 1 : 0]].dtype;
  ADD_FAILURE() << "no node " << name;
  return DType::kF32;
}

class SensitivityFallback : public testing::TestWithParam<std::string> {};

// A tolerance of 0 keeps float every layer with a measurable error, a tight one fewer, a huge
// one none; whenever the fallback stops short of every layer, the plan it chose measured under
// the tolerance, and the all-int8 plan above it when anything was kept.
TEST_P(SensitivityFallback, TheToleranceDecidesHowManyLayersStayFloat) {
  Context ctx(ContextOptions{LogLevel::kError, 2});
  const std::string dir = fixture(GetParam());
  const BuildOptions o = calibrated(ctx, dir);
  SensitivityReport zero, tight, huge;
  fallback(ctx, dir, o, 0.0, &zero);
  ASSERT_GT(zero.layers.size(), 10u);
  // Tight: a tenth of the all-int8 plan's error, which one layer alone cannot be all of.
  const double tight_tolerance = zero.all_int8.mean_kl / 10.0;
  const CalibrationCache tight_cache = fallback(ctx, dir, o, tight_tolerance, &tight);
  const CalibrationCache huge_cache = fallback(ctx, dir, o, 1e9, &huge);
  EXPECT_GT(zero.all_int8.mean_kl, 0.0);
  EXPECT_EQ(huge.kept, 0u);
  EXPECT_TRUE(huge_cache.fallback.empty());
  EXPECT_GT(tight.kept, 0u);
  EXPECT_GE(zero.kept, tight.kept);
  EXPECT_GT(zero.kept, 0u);
  for (const SensitivityReport* r : {&tight, &huge}) {
    EXPECT_LE(r->chosen.mean_kl, r == &tight ? tight_tolerance : 1e9);
    EXPECT_GT(r->positions, r->prompts);  // every prompt scores its generated tokens
    EXPECT_EQ(r->prompts, 12);
  }
  EXPECT_GT(tight.all_int8.mean_kl, tight_tolerance);
  EXPECT_LT(tight.chosen.mean_kl, tight.all_int8.mean_kl);
  // The cache lists exactly the kept layers' nodes, each with its own measurement.
  size_t nodes = 0;
  for (size_t i = 0; i < tight.kept; ++i)
    for (const std::string& n : tight.layers[i].nodes) {
      ++nodes;
      ASSERT_TRUE(tight_cache.fallback.count(n)) << n;
      EXPECT_EQ(tight_cache.fallback.at(n), tight.layers[i].error) << n;
    }
  EXPECT_EQ(tight_cache.fallback.size(), nodes);
  EXPECT_EQ(tight_cache.quant_tolerance, tight_tolerance);
  // Worst first.
  for (size_t i = 1; i < tight.layers.size(); ++i)
    EXPECT_GE(tight.layers[i - 1].error.mean_kl, tight.layers[i].error.mean_kl);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SensitivityFallback, testing::Values("t5-tiny", "bloom-tiny"));

// The outlier layer measures worst by far and is the one layer the default tolerance keeps
// float; the plan built from the cache records why, a written plan keeps it (what `kiln inspect
// --layers` shows), a cache-only rebuild from the written cache is the same plan, and the
// fallback plan answers the dev set at least as well as the all-int8 plan.
TEST(SensitivityFallbackOutlier, TheSensitiveLayerIsTheOneKeptFloat) {
  Context ctx(ContextOptions{LogLevel::kError, 2});
  const std::string dir = outlier_t5(1000.0f);
  const BuildOptions o = calibrated(ctx, dir);
  SensitivityReport report;
  const CalibrationCache cache = fallback(ctx, dir, o, kDefaultQuantTolerance, &report, 32);
  ASSERT_GE(report.layers.size(), 2u);
  EXPECT_EQ(report.layers[0].nodes, std::vector<std::string>{kSensitiveLayer});
  EXPECT_GT(report.layers[0].error.mean_kl, 10.0 * report.layers[1].error.mean_kl);
  EXPECT_GT(report.all_int8.mean_kl, kDefaultQuantTolerance);
  EXPECT_EQ(report.kept, 1u);
  ASSERT_EQ(cache.fallback.size(), 1u);
  EXPECT_EQ(cache.fallback.begin()->first, kSensitiveLayer);
  EXPECT_LE(report.chosen.mean_kl, kDefaultQuantTolerance);

  // The plan: that Linear float with its measured error as the reason, every other one int8.
  const ModelIR plan = build_model(dir, with_cache(o, cache), Logger(LogLevel::kSilent));
  EXPECT_EQ(weight_dtype(plan, kSensitiveLayer), DType::kF32);
  EXPECT_EQ(weight_dtype(plan, "encoder.block.1.layer.1.DenseReluDense.wi"), DType::kI8);
  const std::string why = note_of(plan, kSensitiveLayer);
  EXPECT_NE(why.find("sensitivity fallback"), std::string::npos) << why;
  EXPECT_NE(why.find(fmt::format("{:.3g}", report.layers[0].error.mean_kl)), std::string::npos)
      << why;

  // Written and read back, as `kiln inspect` reads it.
  const std::string plan_path = temp_dir("sens_plan") + "/outlier.plan";
  write_plan(plan_path, plan, PlanBuildInfo{}, Logger(LogLevel::kSilent));
  const ModelIR read = read_plan(plan_path, Logger(LogLevel::kSilent));
  EXPECT_EQ(note_of(read, kSensitiveLayer), why);
  EXPECT_EQ(weight_dtype(read, kSensitiveLayer), DType::kF32);

  // A cache-only rebuild keeps the same layer.
  const std::string cache_path = temp_dir("sens_cache") + "/outlier.calib";
  write_calibration_cache(cache_path, cache);
  const CalibrationCache reread = read_calibration_cache(cache_path);
  EXPECT_EQ(reread, cache);
  const ModelIR again = build_model(dir, with_cache(o, reread), Logger(LogLevel::kSilent));
  EXPECT_EQ(weight_dtype(again, kSensitiveLayer), DType::kF32);
  EXPECT_EQ(note_of(again, kSensitiveLayer), why);

  // Dev accuracy: fallback >= all-int8 (and the outlier costs the all-int8 plan answers).
  CompiledModel fp32(ctx, build_model(dir, BuildOptions{}, Logger(LogLevel::kSilent)));
  CompiledModel all_int8(ctx, build_model(dir, o, Logger(LogLevel::kSilent)));
  CompiledModel fallback_plan(ctx,
                              build_model(dir, with_cache(o, cache), Logger(LogLevel::kSilent)));
  const int f = dev_exact_matches(fp32, 3), a = dev_exact_matches(all_int8, 3),
            b = dev_exact_matches(fallback_plan, 3);
  std::printf("outlier t5 (200 dev rows): fp32 %d, all-int8 %d, fallback %d exact\n", f, a, b);
  EXPECT_GE(b, a);
  EXPECT_GE(b, f - 4);  // within two points of fp32
}

// A cache that keeps in float a layer the model does not have is refused, naming it.
TEST(SensitivityFallbackOutlier, ACacheKeepingAnUnknownLayerIsRefused) {
  Context ctx(ContextOptions{LogLevel::kError, 2});
  const std::string dir = fixture("t5-tiny");
  BuildOptions o = calibrated(ctx, dir);
  o.precision_options.calibration->quant_tolerance = 0.005;
  o.precision_options.calibration->fallback["encoder.block.9.layer.0.SelfAttention.qkv"] = {};
  try {
    build_model(dir, o, Logger(LogLevel::kSilent));
    ADD_FAILURE() << "built";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    EXPECT_NE(std::string(e.what()).find("encoder.block.9.layer.0.SelfAttention.qkv"),
              std::string::npos)
        << e.what();
  }
}

// On the fixture models, the plan a tight tolerance chooses answers the dev set at least as well
// as the all-int8 plan, within a point.
TEST_P(SensitivityFallback, TheFallbackPlanIsAsAccurateAsAllInt8) {
  Context ctx(ContextOptions{LogLevel::kError, 2});
  const std::string dir = fixture(GetParam());
  const BuildOptions o = calibrated(ctx, dir);
  SensitivityReport report;
  const CalibrationCache cache = fallback(ctx, dir, o, 1e-5, &report);
  CompiledModel all_int8(ctx, build_model(dir, o, Logger(LogLevel::kSilent)));
  CompiledModel fallback_plan(ctx,
                              build_model(dir, with_cache(o, cache), Logger(LogLevel::kSilent)));
  const int a = dev_exact_matches(all_int8, 3), b = dev_exact_matches(fallback_plan, 3);
  std::printf("%s (200 dev rows): all-int8 %d, fallback (%zu layers float) %d exact\n",
              GetParam().c_str(), a, report.kept, b);
  EXPECT_GE(b, a - 2);
}

}  // namespace
}  // namespace kiln::test
