// The calibration runner (builder/calibration_runner.h) on the fixture models: every Linear of
// the plan gets statistics and a scale, and the min-max amax recorded for a Linear's input equals
// the largest |x| found by watching the same generation through the activation observer
// directly (no histogram involved).
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "../models/parity_util.h"
#include "builder/builder.h"
#include "builder/calibration_runner.h"
#include "graph/linear.h"
#include "runtime/scheduler.h"

namespace kiln::test {
namespace {

std::vector<CalibrationPrompt> first_prompts(size_t n) {
  std::vector<CalibrationPrompt> all = read_calibration_prompts(fixture("data/calib.jsonl"));
  all.resize(std::min(n, all.size()));
  return all;
}

void check_runner(const std::string& model_dir, const std::string& prompt_template) {
  Context ctx(ContextOptions{LogLevel::kError, 2});
  BuildOptions build;
  build.prompt_template = prompt_template;
  auto model = compile_model_dir(ctx, fixture(model_dir), build);
  const ModelIR& ir = model->model();
  const std::vector<CalibrationPrompt> prompts = first_prompts(12);
  CalibrationRunOptions options;
  options.batch = 5;
  options.new_tokens = 4;
  const ActivationStats stats = collect_activation_stats(*model, prompts, options);

  // The same generation watched through the observer by hand: max |x| per Linear input.
  std::map<std::string, double> amax;
  ActivationObserver watch;
  watch.selection.ops = {OpKind::kLinear};
  watch.callback = [&](const Observation& ob) {
    const Node& n = ob.graph.nodes[static_cast<size_t>(ob.node)];
    const Value& x = ob.graph.values[static_cast<size_t>(n.inputs[0])];
    double& m = amax[ob.graph.name + "/" + x.name];
    const float* p = ob.value.data<float>();
    for (int64_t i = 0; i < ob.value.numel(); ++i) m = std::max(m, double{std::fabs(p[i])});
  };
  model->set_observer(watch);
  std::vector<std::vector<int64_t>> ids;
  int64_t prompt_tokens = 0;
  for (const CalibrationPrompt& p : prompts) {
    ids.push_back(model->tokenizer().encode(apply_prompt_template(ir.prompt_template, p.text)));
    prompt_tokens += static_cast<int64_t>(ids.back().size());
  }
  GenerationParams params = default_generation_params(model->desc());
  params.num_beams = 1;
  params.do_sample = false;
  params.max_length = 0;
  params.max_new_tokens = options.new_tokens;
  SchedulerOptions so;
  so.max_batch = options.batch;
  int64_t generated = 0;
  {
    Scheduler scheduler(*model, so);
    for (const GenerationResult& r : scheduler.generate(ids, params))
      generated += static_cast<int64_t>(r.output_ids.size());
  }
  model->set_observer({});

  EXPECT_EQ(stats.prompts, 12);
  EXPECT_EQ(stats.prompt_tokens, prompt_tokens);
  EXPECT_EQ(stats.generated_tokens, generated);
  EXPECT_GT(generated, 0);

  // Every Linear of every graph has statistics, and each amax is the hand-found one.
  int linears = 0;
  for (const Graph& g : ir.graphs)
    for (const Node& n : g.nodes) {
      if (n.op != OpKind::kLinear) continue;
      ++linears;
      const std::string name = g.name + "/" + g.values[static_cast<size_t>(n.inputs[0])].name;
      ASSERT_TRUE(stats.histograms.contains(name)) << n.name << " reads " << name;
      ASSERT_TRUE(amax.contains(name)) << name;
      EXPECT_EQ(stats.histograms.at(name).amax(), amax.at(name)) << name;
      EXPECT_GT(stats.histograms.at(name).count(), 0) << name;
    }
  EXPECT_GT(linears, 4);
  EXPECT_EQ(stats.histograms.size(), calibrated_tensors(ir).size());
  if (ir.desc.encoder_decoder) {
    bool decoder_seen = false;
    for (const auto& [name, h] : stats.histograms) decoder_seen |= name.rfind("decoder/", 0) == 0;
    EXPECT_TRUE(decoder_seen) << "the decoder's Linears are calibrated too";
  }

  // Scales for every tensor, each method; min-max's is amax / 127.
  const CalibrationCache minmax = calibrate_model(ir, stats, parse_calibration_method("minmax"));
  const CalibrationCache entropy = calibrate_model(ir, stats, parse_calibration_method("entropy"));
  EXPECT_NO_THROW(check_calibration_cache(minmax, "minmax", calibration_fingerprint(ir),
                                          calibrated_tensors(ir)));
  for (const auto& [name, scale] : minmax.scales) {
    EXPECT_EQ(scale, static_cast<float>(amax.at(name) / 127.0)) << name;
    EXPECT_GT(scale, 0.0f) << name;
    EXPECT_LE(entropy.scales.at(name), scale) << name << ": entropy clips, never widens";
  }
}

TEST(CalibRunner, T5TinyEveryLinearInputMatchesTheObserver) { check_runner("t5-tiny", "{prompt}"); }

TEST(CalibRunner, BloomTinyEveryLinearInputMatchesTheObserver) {
  check_runner("bloom-tiny", "{prompt} =");
}

TEST(CalibRunner, AnotherModelsFingerprintDiffers) {
  Context ctx(ContextOptions{LogLevel::kError, 2});
  auto t5 = compile_model_dir(ctx, fixture("t5-tiny"));
  auto bloom = compile_model_dir(ctx, fixture("bloom-tiny"));
  EXPECT_NE(calibration_fingerprint(t5->model()), calibration_fingerprint(bloom->model()));
  EXPECT_EQ(calibration_fingerprint(t5->model()),
            calibration_fingerprint(compile_model_dir(ctx, fixture("t5-tiny"))->model()));
}

}  // namespace
}  // namespace kiln::test
