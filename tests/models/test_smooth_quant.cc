// SmoothQuant (passes/smooth_quant.h, `kiln build --precision int8 --calib F --smoothquant A`):
// the factors by the paper's formula on a hand-made graph, folded into the norm and the weight
// columns; the smoothed fp32 fixture models compute the unsmoothed ones' logits; int8 plans
// built with it keep their factors in the cache (format version 2), rebuild from it alone to the
// same ids, and generate close to fp32; malformed smoothing in a cache is refused.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

#include "builder/builder.h"
#include "builder/calibration_runner.h"
#include "graph/builder.h"
#include "io/jsonl.h"
#include "model_runner.h"
#include "parity_util.h"
#include "passes/smooth_quant.h"
#include "runtime/scheduler.h"

namespace kiln::test {
namespace {

const Logger kQuiet(LogLevel::kSilent);

std::string temp_path(const std::string& name) {
  std::filesystem::create_directories(KILN_TEST_TMP);
  return std::string(KILN_TEST_TMP) + "/" + name;
}

// x [tokens, 4] -> LayerNorm(gamma, beta) -> Linear(w [3, 4]) -> y, and the norm's output read by
// a second Linear when `two_readers`.
ModelIR norm_linear_model(bool two_readers) {
  GraphBuilder b("g");
  const int x = b.input("x", DType::kF32, {Dim::sym("tokens"), Dim::of(4)});
  const int gamma = b.weight("gamma", Tensor::from_vector<float>({1.f, 2.f, 3.f, 4.f}, {4}));
  const int beta = b.weight("beta", Tensor::from_vector<float>({0.5f, -1.f, 2.f, 6.f}, {4}));
  const int h = b.layer_norm(x, gamma, beta, 1e-5, "norm");
  // Column maxima |w[:, j]|: 1, 4, 4, 1 (with the second reader's 0.5, 2, 4, 0.25 folded in).
  const int w = b.weight("w", Tensor::from_vector<float>({1.f, -4.f, 2.f, 0.5f,   //
                                                          -0.5f, 1.f, -4.f, 1.f,  //
                                                          0.25f, 2.f, 1.f, -1.f},
                                                         {3, 4}));
  b.output(b.linear(h, w, -1, "fc"), "y");
  if (two_readers) {
    const int w2 = b.weight(
        "w2", Tensor::from_vector<float>({0.5f, -2.f, 4.f, 0.25f, 0.1f, 0.1f, 0.1f, 0.1f}, {2, 4}));
    b.output(b.linear(h, w2, -1, "fc2"), "z");
  }
  ModelIR m;
  m.graphs.push_back(b.finish());
  return m;
}

// s_j = max|x_j|^alpha / max|w_j|^(1 - alpha): with alpha 0.5, x maxima 4, 1, 16, 9 and weight
// column maxima 1, 4, 4, 1 the factors are 2, 0.5, 2, 3; the norm's gamma and beta are divided by
// them and the weight's columns multiplied.
TEST(SmoothQuant, FactorsAndFoldingByTheDefinition) {
  for (bool two : {false, true}) {
    ModelIR m = norm_linear_model(two);
    Graph& g = m.graphs[0];
    const std::vector<SmoothTarget> targets = smoothable_tensors(g, {});
    ASSERT_EQ(targets.size(), 1u);
    EXPECT_EQ(targets[0].linears.size(), two ? 2u : 1u);
    const std::string tensor = "g/" + g.values[targets[0].value].name;
    const auto factors = smoothquant_factors(m, {{tensor, {4.f, 1.f, 16.f, 9.f}}}, 0.5, {});
    ASSERT_EQ(factors.size(), 1u);
    EXPECT_EQ(factors.at(tensor), (std::vector<float>{2.f, 0.5f, 2.f, 3.f}));
    // alpha 1: the activations' maxima alone.
    EXPECT_EQ(smoothquant_factors(m, {{tensor, {4.f, 1.f, 16.f, 9.f}}}, 1.0, {}).at(tensor),
              (std::vector<float>{4.f, 1.f, 16.f, 9.f}));
    ASSERT_EQ(apply_smoothing(g, factors, {}, kQuiet), 1);
    auto values = [&](const char* name) {
      const Tensor& t = g.values[g.find_value(name)].data;
      return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
    };
    EXPECT_EQ(values("gamma"), (std::vector<float>{0.5f, 4.f, 1.5f, 4.f / 3.f}));
    EXPECT_EQ(values("beta"), (std::vector<float>{0.25f, -2.f, 1.f, 2.f}));
    EXPECT_EQ(values("w"), (std::vector<float>{2.f, -2.f, 4.f, 1.5f,   //
                                               -1.f, 0.5f, -8.f, 3.f,  //
                                               0.5f, 1.f, 2.f, -3.f}));
    if (two) {
      EXPECT_EQ(values("w2"),
                (std::vector<float>{1.f, -1.f, 8.f, 0.75f, 0.2f, 0.05f, 0.2f, 0.1f * 3.f}));
    }
  }
}

// What cannot be smoothed is left alone, and factors for it are refused: a norm whose output is
// a graph output, or is read by something besides Linears, or by a Linear kept in float.
TEST(SmoothQuant, OnlyNormOutputsReadByQuantizedLinearsAlone) {
  {
    ModelIR m = norm_linear_model(false);
    EXPECT_TRUE(smoothable_tensors(m.graphs[0], {"fc"}).empty()) << "fc is kept in float";
  }
  GraphBuilder b("g");
  const int x = b.input("x", DType::kF32, {Dim::sym("tokens"), Dim::of(4)});
  const int h =
      b.layer_norm(x, b.weight("gamma", Tensor::from_vector<float>({1, 1, 1, 1}, {4})),
                   b.weight("beta", Tensor::from_vector<float>({0, 0, 0, 0}, {4})), 1e-5, "norm");
  b.output(
      b.linear(h, b.weight("w", Tensor::from_vector<float>(std::vector<float>(8, 1.f), {2, 4})), -1,
               "fc"),
      "y");
  b.output(b.add(h, x, "residual"), "r");
  ModelIR m;
  m.graphs.push_back(b.finish());
  EXPECT_TRUE(smoothable_tensors(m.graphs[0], {}).empty());
  try {
    apply_smoothing(m.graphs[0], {{"g/" + m.graphs[0].values[h].name, {1.f, 1.f, 1.f, 1.f}}}, {},
                    kQuiet);
    FAIL() << "smoothed a tensor an Add reads";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("can smooth"), std::string::npos) << e.what();
  }
}

std::vector<CalibrationPrompt> calib_prompts(size_t n) {
  std::vector<CalibrationPrompt> all = read_calibration_prompts(fixture("data/calib.jsonl"));
  all.resize(std::min(n, all.size()));
  return all;
}

std::string template_of(const std::string& model) {
  return model == "bloom-tiny" ? "{prompt} =" : "{prompt}";
}

class SmoothQuantModels : public testing::TestWithParam<std::string> {};

// The smoothed fp32 model computes the same function: its logits within 1e-4 of max |logit| of
// the unsmoothed model's (f32 roundings of the scaled weights and norms), while its weights do
// differ. Factors from real statistics (alpha 0.5, 32 calibration prompts).
TEST_P(SmoothQuantModels, TheSmoothedFloatModelComputesTheSameLogits) {
  const std::string model = GetParam();
  Context ctx(ContextOptions{LogLevel::kError, 2});
  BuildOptions o;
  o.prompt_template = template_of(model);
  const auto plain = compile_model_dir(ctx, fixture(model), o);
  CalibrationRunOptions run;
  run.batch = 8;
  const ActivationStats stats = collect_activation_stats(*plain, calib_prompts(32), run);
  const auto factors = smoothquant_factors(plain->model(), stats.channel_amax, 0.5, {});
  EXPECT_GE(factors.size(), model == "bloom-tiny" ? 12u : 20u);
  bool moved = false;
  for (const auto& [name, s] : factors)
    for (float f : s) moved |= std::fabs(f - 1.0f) > 0.1f;
  EXPECT_TRUE(moved) << "every factor is about 1";
  o.precision_options.smoothing = factors;
  const auto smoothed = compile_model_dir(ctx, fixture(model), o);
  for (const char* text : {"reverse: suvogi", "add: 456 + 95", "sort: d b a c"}) {
    const std::vector<int64_t> ids =
        plain->tokenizer().encode(apply_prompt_template(o.prompt_template, text));
    const std::vector<int64_t> dec =
        plain->desc().encoder_decoder ? std::vector<int64_t>{0, 5, 9} : ids;
    const Forward a = run_forward(*plain, ids, dec, false);
    const Forward b = run_forward(*smoothed, ids, dec, false);
    EXPECT_LE(relative_error(b.logits, a.logits), 1e-4) << text;
  }
}

// An int8 plan with SmoothQuant: the cache records alpha and the factors (format version 2) and
// reads back equal; a rebuild from it alone generates the calibrated plan's ids; and on a fifth
// of the dev set it answers within five points of fp32 and agrees with fp32's first token on nine
// rows in ten.
TEST_P(SmoothQuantModels, Int8WithSmoothQuantRebuildsFromItsCache) {
  const std::string model = GetParam();
  Context ctx(ContextOptions{LogLevel::kError, 2});
  BuildOptions o;
  o.precision = Precision::kInt8;
  o.prompt_template = template_of(model);
  CalibrationRunOptions run;
  run.batch = 16;
  const CalibrationCache cache =
      calibrate_checkpoint(ctx, fixture(model), o, calib_prompts(128), run,
                           parse_calibration_method("percentile:99.99"), nullptr, 0.5);
  EXPECT_EQ(cache.smoothquant_alpha, 0.5);
  EXPECT_FALSE(cache.smoothing.empty());
  const std::string path = temp_path(model + "-smooth.calib");
  write_calibration_cache(path, cache);
  {
    std::ifstream in(path);
    std::string header;
    std::getline(in, header);
    EXPECT_NE(header.find("kiln-calibration-cache 2 "), std::string::npos) << header;
    EXPECT_NE(header.find(" smoothquant=0.5"), std::string::npos) << header;
  }
  const CalibrationCache read = read_calibration_cache(path);
  EXPECT_EQ(read, cache);
  auto build = [&](CalibrationCache c) {
    BuildOptions b = o;
    b.precision_options.calibration = std::move(c);
    b.precision_options.calibration_source = path;
    return compile_model_dir(ctx, fixture(model), b);
  };
  const auto calibrated = build(cache), rebuilt = build(read);
  BuildOptions fo;
  fo.prompt_template = o.prompt_template;
  const auto fp32 = compile_model_dir(ctx, fixture(model), fo);
  std::vector<std::vector<int64_t>> prompts;
  std::vector<std::string> answers;
  int row = 0;
  read_jsonl(fixture("data/dev.jsonl"), [&](const nlohmann::json& j, int) {
    if (row++ % 5 != 0) return;
    prompts.push_back(fp32->tokenizer().encode(
        apply_prompt_template(o.prompt_template, j.at("prompt").get<std::string>())));
    answers.push_back(j.at("answer").get<std::string>());
  });
  GenerationParams p = default_generation_params(fp32->desc());
  p.num_beams = 1;
  p.do_sample = false;
  p.max_new_tokens = 32;
  p.max_length = 0;
  SchedulerOptions so;
  so.max_batch = 16;
  auto generate = [&](CompiledModel& m) {
    Scheduler s(m, so);
    std::vector<std::vector<int64_t>> out;
    for (const GenerationResult& r : s.generate(prompts, p)) out.push_back(r.output_ids);
    return out;
  };
  const auto a = generate(*calibrated), b = generate(*rebuilt), f = generate(*fp32);
  EXPECT_EQ(a, b);
  auto right = [&](CompiledModel& m, const std::vector<std::vector<int64_t>>& ids) {
    int n = 0;
    for (size_t i = 0; i < ids.size(); ++i) {
      std::string t = m.tokenizer().decode(ids[i]);
      t.erase(0, t.find_first_not_of(' '));
      n += t == answers[i];
    }
    return n;
  };
  int first = 0;
  for (size_t i = 0; i < a.size(); ++i)
    first += !a[i].empty() && !f[i].empty() && a[i][0] == f[i][0];
  const double n = static_cast<double>(a.size());
  EXPECT_GE(right(*calibrated, a) / n, right(*fp32, f) / n - 0.05);
  EXPECT_GE(first / n, 0.9);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, SmoothQuantModels, testing::Values("t5-tiny", "bloom-tiny"),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return info.param == "t5-tiny" ? std::string("T5")
                                                          : std::string("Bloom");
                         });

// A cache's smoothing that is malformed is refused naming the line: a 'smooth' line in a version-1
// cache, a factor that is not positive, an alpha outside (0, 1].
TEST(SmoothQuantBadInput, MalformedSmoothingInACacheIsRefused) {
  struct Case {
    const char* text;
    const char* what;
  };
  for (const Case& c :
       {Case{"kiln-calibration-cache 1 model=0123456789abcdef method=entropy\n"
             "smooth g/x 1 2\ng/x 0.5\n",
             ":2"},
        Case{"kiln-calibration-cache 2 model=0123456789abcdef method=entropy smoothquant=0.5\n"
             "smooth g/x 1 -2\ng/x 0.5\n",
             "factor '-2'"},
        Case{"kiln-calibration-cache 2 model=0123456789abcdef method=entropy smoothquant=1.5\n"
             "smooth g/x 1 2\ng/x 0.5\n",
             "smoothquant=1.5"},
        Case{"kiln-calibration-cache 2 model=0123456789abcdef method=entropy smoothquant=0.5\n"
             "g/x 0.5\n",
             "no 'smooth' lines"}}) {
    const std::string path = temp_path("bad-smooth.calib");
    std::ofstream(path) << c.text;
    try {
      read_calibration_cache(path);
      ADD_FAILURE() << "accepted: " << c.text;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(c.what), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace kiln::test
