// AWQ's scale search for int4-weight plans (passes/awq.h, builder/calibration_runner.h) on the
// fixture models and on a copy of t5-tiny given outlier channels on purpose (a quarter of every
// encoder block's attention-norm output channels scaled up, their q/k/v weight columns scaled
// down by as much: the same fp32 function, whose scaled-down columns plain int4 rounds to zero).
// The search never measures worse than plain quantization, its factors fold into the float model
// without changing it, and on the outlier copy it brings the int4 plan's dev accuracy back to
// within 2 points of fp32.
#include <gtest/gtest.h>

#include <cmath>

#include "builder/builder.h"
#include "builder/calibration_runner.h"
#include "quant_test_util.h"
#include "runtime/forward.h"

namespace kiln::test {
namespace {

std::string template_for(const std::string& dir) {
  return dir.find("bloom") != std::string::npos ? "{prompt} =" : "{prompt}";
}

AwqResult search(Context& ctx, const std::string& dir) {
  BuildOptions o;
  o.precision = Precision::kInt4Weight;
  o.prompt_template = template_for(dir);
  CalibrationRunOptions run;
  run.batch = 16;
  run.new_tokens = 4;
  run.sample_rows = 64;
  return awq_checkpoint(ctx, dir, o, calib_prompts(64), run, 10);
}

class Awq : public testing::TestWithParam<std::string> {};

// Every searched tensor: the choice's error is at most plain quantization's (α = 0 is on the
// grid), some tensor is scaled with less error, and every factor is positive and finite. The
// fp32 model with the factors folded in computes the same logits.
TEST_P(Awq, TheSearchNeverMeasuresWorseAndKeepsTheFloatModel) {
  Context ctx(ContextOptions{LogLevel::kError, 2});
  const std::string dir = fixture(GetParam());
  const AwqResult r = search(ctx, dir);
  ASSERT_FALSE(r.choices.empty());
  EXPECT_TRUE(r.skipped.empty());
  int better = 0;
  for (const auto& [name, c] : r.choices) {
    EXPECT_LE(c.error, c.plain_error) << name;
    EXPECT_GE(c.linears, 1) << name;
    better += c.error < c.plain_error;
    EXPECT_EQ(r.factors.count(name), c.alpha > 0.0 ? 1u : 0u) << name;
  }
  EXPECT_GT(better, 0);
  for (const auto& [name, s] : r.factors)
    for (float f : s) ASSERT_TRUE(std::isfinite(f) && f > 0.0f) << name;

  BuildOptions fp32;
  fp32.prompt_template = template_for(dir);
  BuildOptions folded = fp32;
  folded.precision_options.smoothing = r.factors;
  CompiledModel a(ctx, build_model(dir, fp32, ctx.log()));
  CompiledModel b(ctx, build_model(dir, folded, ctx.log()));
  const std::vector<int64_t> prompt =
      a.tokenizer().encode(apply_prompt_template(fp32.prompt_template, "reverse: suvogi"));
  const bool t5 = a.desc().encoder_decoder;
  const std::vector<int64_t> dec = t5 ? std::vector<int64_t>{0, 5, 9, 14} : prompt;
  const Forward fa = run_forward(a, prompt, dec, false), fb = run_forward(b, prompt, dec, false);
  const Tensor la = fa.logits.to_f32(), lb = fb.logits.to_f32();
  ASSERT_EQ(la.numel(), lb.numel());
  double worst = 0.0, scale = 0.0;
  for (int64_t i = 0; i < la.numel(); ++i) {
    worst =
        std::max(worst, std::fabs(static_cast<double>(la.data<float>()[i]) - lb.data<float>()[i]));
    scale = std::max(scale, std::fabs(static_cast<double>(la.data<float>()[i])));
  }
  EXPECT_LE(worst, 1e-4 * scale) << "max |logit| " << scale;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Awq, testing::Values("t5-tiny", "bloom-tiny"));

// The outlier copy: plain int4 loses the scaled-down columns and most answers; AWQ scales them
// back up (α near 1 on that tensor) and answers within 2 points of fp32 on 200 dev rows.
TEST(AwqOutlier, TheScalesRecoverTheOutlierChannels) {
  Context ctx(ContextOptions{LogLevel::kError, 2});
  const std::string dir = outlier_t5(30.0f, {0, 1, 2, 3});
  const AwqResult r = search(ctx, dir);
  const auto outlier =
      std::max_element(r.choices.begin(), r.choices.end(), [](const auto& x, const auto& y) {
        return x.second.plain_error - x.second.error < y.second.plain_error - y.second.error;
      });
  ASSERT_NE(outlier, r.choices.end());
  EXPECT_GE(outlier->second.alpha, 0.5) << outlier->first;
  EXPECT_LT(outlier->second.error, 0.1 * outlier->second.plain_error) << outlier->first;

  BuildOptions o;
  CompiledModel fp32(ctx, build_model(dir, o, ctx.log()));
  o.precision = Precision::kInt4Weight;
  CompiledModel plain(ctx, build_model(dir, o, ctx.log()));
  o.precision_options.smoothing = r.factors;
  CompiledModel awq(ctx, build_model(dir, o, ctx.log()));
  const int f = dev_exact_matches(fp32, 3), p = dev_exact_matches(plain, 3),
            a = dev_exact_matches(awq, 3);
  std::printf("outlier t5-tiny, 200 dev rows: fp32 %d, int4 %d, int4 + awq %d exact\n", f, p, a);
  EXPECT_GE(a, f - 4);  // 2 points of 200 rows
  EXPECT_GT(a, p + 10);
}

}  // namespace
}  // namespace kiln::test
