// int8 (W8A8) plans of the fixture models, built from a calibration (builder/calibration_runner.h:
// calibrate_checkpoint, what `kiln build --precision int8 --calib` runs): every Linear but the
// logits one reads its input as int8 with the calibrated scale, a rebuild from the written cache
// alone generates the calibrated plan's ids, a cache made for another model (or for the same
// shapes with other weights) is refused, and the plan generates close to the fp32 plan.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>

#include "backend/backend.h"
#include "backend/cuda_info.h"
#include "builder/builder.h"
#include "builder/calibration_runner.h"
#include "io/jsonl.h"
#include "io/safetensors.h"
#include "model_runner.h"
#include "parity_util.h"
#include "passes/precision_plan.h"
#include "runtime/scheduler.h"

namespace kiln::test {
namespace {

namespace fs = std::filesystem;

std::string temp_path(const std::string& name) {
  fs::create_directories(KILN_TEST_TMP);
  return std::string(KILN_TEST_TMP) + "/" + name;
}

std::string template_of(const std::string& model) {
  return model == "bloom-tiny" ? "{prompt} =" : "{prompt}";
}

BuildOptions int8_options(const std::string& model) {
  BuildOptions o;
  o.precision = Precision::kInt8;
  o.prompt_template = template_of(model);
  return o;
}

// The fixture's calibration prompts, the first `n`.
std::vector<CalibrationPrompt> calib_prompts(size_t n) {
  std::vector<CalibrationPrompt> all = read_calibration_prompts(fixture("data/calib.jsonl"));
  all.resize(std::min(n, all.size()));
  return all;
}

CalibrationCache calibrate(Context& ctx, const std::string& model, size_t prompts = 64) {
  CalibrationRunOptions run;
  run.batch = 16;
  return calibrate_checkpoint(ctx, fixture(model), int8_options(model), calib_prompts(prompts), run,
                              parse_calibration_method("entropy"));
}

BuildOptions calibrated_options(const std::string& model, CalibrationCache cache,
                                const std::string& source, Device device = Device::kCpu) {
  BuildOptions o = int8_options(model);
  o.device = device;
  o.precision_options.calibration = std::move(cache);
  o.precision_options.calibration_source = source;
  return o;
}

std::unique_ptr<CompiledModel> build_int8(Context& ctx, const std::string& dir,
                                          const std::string& model, CalibrationCache cache,
                                          const std::string& source, Device device = Device::kCpu) {
  return compile_model_dir(ctx, dir, calibrated_options(model, std::move(cache), source, device));
}

// Dev-set rows: task, prompt, answer.
struct DevRow {
  std::string task, prompt, answer;
};
std::vector<DevRow> dev_rows(size_t every) {
  std::vector<DevRow> rows;
  size_t i = 0;
  read_jsonl(fixture("data/dev.jsonl"), [&](const nlohmann::json& j, int) {
    if (i++ % every == 0)
      rows.push_back({j.at("task").get<std::string>(), j.at("prompt").get<std::string>(),
                      j.at("answer").get<std::string>()});
  });
  return rows;
}

// Greedy ids for every row, batched as `kiln eval` batches them.
std::vector<std::vector<int64_t>> generate(CompiledModel& m, const std::vector<DevRow>& rows) {
  std::vector<std::vector<int64_t>> ids;
  for (const DevRow& r : rows)
    ids.push_back(m.tokenizer().encode(apply_prompt_template(m.model().prompt_template, r.prompt)));
  GenerationParams p = default_generation_params(m.desc());
  p.num_beams = 1;
  p.do_sample = false;
  p.max_new_tokens = 32;
  p.max_length = 0;
  SchedulerOptions so;
  so.max_batch = 16;
  Scheduler s(m, so);
  std::vector<std::vector<int64_t>> out;
  for (const GenerationResult& r : s.generate(ids, p)) out.push_back(r.output_ids);
  return out;
}

std::string trim(const std::string& s) {
  const size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r\n") - b + 1);
}

int exact_matches(CompiledModel& m, const std::vector<DevRow>& rows,
                  const std::vector<std::vector<int64_t>>& ids) {
  int n = 0;
  for (size_t i = 0; i < rows.size(); ++i)
    n += trim(m.tokenizer().decode(ids[i])) == rows[i].answer;
  return n;
}

// How many rows' first generated tokens agree between two runs of the same rows.
int first_tokens_agree(const std::vector<std::vector<int64_t>>& a,
                       const std::vector<std::vector<int64_t>>& b) {
  int agree = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i)
    agree += !a[i].empty() && !b[i].empty() && a[i][0] == b[i][0];
  return agree;
}

// The calibration cache's scale for the input `x` of a Linear of `g`: the value the calibration
// observed is x, or the f32 value a Cast narrowed into x (fp16 T5's norms on CUDA).
const float* cached_scale(const CalibrationCache& cache, const Graph& g, int x) {
  if (const int p = g.values[x].producer; p >= 0 && g.nodes[p].op == OpKind::kCast)
    x = g.nodes[p].inputs[0];
  const auto it = cache.scales.find(calibrated_tensor_name(g, x));
  return it == cache.scales.end() ? nullptr : &it->second;
}

class Int8Plan : public testing::TestWithParam<std::string> {};

// The plan the pass makes: every Linear but the logits one takes an input scale, the cache's
// value for the tensor it reads; the logits Linear keeps an f32 input (int8 weights), with why.
TEST_P(Int8Plan, EveryLinearButTheLogitsReadsItsCalibratedInput) {
  const std::string model = GetParam();
  Context ctx(ContextOptions{LogLevel::kError, 2});
  const CalibrationCache cache = calibrate(ctx, model);
  const auto plan = build_int8(ctx, fixture(model), model, cache, "test");
  const ModelIR& ir = plan->model();
  int quantized = 0, logits = 0;
  for (const Graph& g : ir.graphs)
    for (const Node& n : g.nodes) {
      if (n.op != OpKind::kLinear) continue;
      EXPECT_EQ(g.values[linear_operand(n, LinearOperand::kWeight)].dtype, DType::kI8) << n.name;
      const int s = linear_operand(n, LinearOperand::kInputScale);
      if (&n - g.nodes.data() == logits_linear(g)) {
        ++logits;
        EXPECT_LT(s, 0) << n.name << ": the logits Linear keeps an f32 input";
        bool noted = false;
        for (const PrecisionNote& note : ir.precision_notes)
          noted |= note.graph == g.name && note.node == n.name &&
                   note.reason.find("logits") != std::string::npos;
        EXPECT_TRUE(noted) << n.name << ": the plan says why";
        continue;
      }
      ASSERT_GE(s, 0) << n.name;
      ++quantized;
      const std::string tensor = calibrated_tensor_name(g, linear_operand(n, LinearOperand::kX));
      EXPECT_EQ(g.values[s].data.data<float>()[0], cache.scales.at(tensor)) << n.name;
      EXPECT_GT(cache.scales.at(tensor), 0.0f) << tensor;
    }
  EXPECT_EQ(logits, 1);
  EXPECT_GT(quantized, 4);
}

// A rebuild from the cache file alone (no prompts run) makes the same plan: the same ids and the
// same logits, bit for bit, as the plan built right after calibrating.
TEST_P(Int8Plan, ACacheOnlyRebuildGeneratesTheCalibratedPlansIds) {
  const std::string model = GetParam();
  Context ctx(ContextOptions{LogLevel::kError, 2});
  const CalibrationCache cache = calibrate(ctx, model);
  const std::string path = temp_path(model + "-int8.calib");
  write_calibration_cache(path, cache);
  const auto calibrated = build_int8(ctx, fixture(model), model, cache, "--calib");
  const auto rebuilt = build_int8(ctx, fixture(model), model, read_calibration_cache(path), path);
  const std::vector<DevRow> rows = dev_rows(15);
  const auto a = generate(*calibrated, rows);
  const auto b = generate(*rebuilt, rows);
  ASSERT_EQ(a.size(), rows.size());
  int generated = 0;
  for (size_t i = 0; i < rows.size(); ++i) {
    EXPECT_EQ(a[i], b[i]) << rows[i].prompt;
    generated += static_cast<int>(a[i].size());
  }
  EXPECT_GT(generated, static_cast<int>(rows.size()));
  const std::vector<int64_t> ids = calibrated->tokenizer().encode(
      apply_prompt_template(calibrated->model().prompt_template, rows[0].prompt));
  const std::vector<int64_t> dec =
      calibrated->desc().encoder_decoder ? std::vector<int64_t>{0} : ids;
  const Forward fa = run_forward(*calibrated, ids, dec, false);
  const Forward fb = run_forward(*rebuilt, ids, dec, false);
  EXPECT_EQ(std::memcmp(fa.logits.raw(), fb.logits.raw(), fa.logits.nbytes()), 0);
}

// On a fifth of the dev set, the int8 plan answers as many rows exactly as the fp32 plan, within
// five points, and agrees with its first generated token on nine rows in ten. (The whole dev set
// is compared with `kiln eval --compare`: tests/cli/int8.sh.)
TEST_P(Int8Plan, GeneratesCloseToTheFp32Plan) {
  const std::string model = GetParam();
  Context ctx(ContextOptions{LogLevel::kError, 2});
  BuildOptions fo;
  fo.prompt_template = template_of(model);
  const auto fp32 = compile_model_dir(ctx, fixture(model), fo);
  const auto int8 = build_int8(ctx, fixture(model), model, calibrate(ctx, model, 256), "test");
  const std::vector<DevRow> rows = dev_rows(5);
  const auto f = generate(*fp32, rows);
  const auto q = generate(*int8, rows);
  const int first_agree = first_tokens_agree(f, q);
  const int fp32_right = exact_matches(*fp32, rows, f), int8_right = exact_matches(*int8, rows, q);
  const double n = static_cast<double>(rows.size());
  EXPECT_GE(int8_right / n, fp32_right / n - 0.05)
      << "fp32 " << fp32_right << ", int8 " << int8_right;
  EXPECT_GE(first_agree / n, 0.9);
  EXPECT_GT(fp32_right / n, 0.5) << "the fixture answers most rows";
}

// A cuda int8 plan (built here, no GPU needed) is calibrated on the CPU's fp32 model: the cache
// fits its graphs, and every Linear reads the cache's scale for its input, in fp16, except the
// logits Linear and, in T5, the FFN output projections that fp16 T5 plans keep f32 (their
// weights int8, their f32 inputs not quantized), each with why.
TEST_P(Int8Plan, ACudaPlanQuantizesItsInputsWithTheCpuCalibration) {
  const std::string model = GetParam();
  Context ctx(ContextOptions{LogLevel::kError, 2});
  const CalibrationCache cache = calibrate(ctx, model, 32);
  const ModelIR ir = build_model(
      fixture(model), calibrated_options(model, cache, "test", Device::kCuda), ctx.log());
  int quantized = 0, f32_inputs = 0;
  for (const Graph& g : ir.graphs)
    for (const Node& n : g.nodes) {
      if (n.op != OpKind::kLinear) continue;
      EXPECT_EQ(g.values[linear_operand(n, LinearOperand::kWeight)].dtype, DType::kI8) << n.name;
      const int x = linear_operand(n, LinearOperand::kX);
      const int s = linear_operand(n, LinearOperand::kInputScale);
      if (s < 0) {
        ++f32_inputs;
        bool noted = false;
        for (const PrecisionNote& note : ir.precision_notes)
          noted |= note.graph == g.name && note.node == n.name && !note.reason.empty();
        EXPECT_TRUE(noted) << n.name << ": the plan says why its input stays float";
        continue;
      }
      ++quantized;
      EXPECT_EQ(g.values[x].dtype, DType::kF16) << n.name;
      EXPECT_FALSE(describe_linear(n).epilogue.norm) << n.name << ": no norm folds into W8A8";
      const float* cached = cached_scale(cache, g, x);
      ASSERT_NE(cached, nullptr) << n.name << " reads " << g.values[x].name;
      EXPECT_EQ(g.values[s].data.data<float>()[0], *cached) << n.name;
    }
  EXPECT_GT(quantized, 8);
  // BLOOM: the logits Linear; T5: that and the four FFN output projections of each graph.
  EXPECT_EQ(f32_inputs, model == "bloom-tiny" ? 1 : 9);
}

// On the GPU (skipped without one), the cuda int8 plan answers within five points of the fp32
// plan on a fifth of the dev set and agrees with the cpu int8 plan's first token on nine rows in
// ten (fp16 activations between the Linears where the cpu's are f32).
TEST_P(Int8Plan, ACudaPlanGeneratesCloseToTheFp32AndCpuInt8Plans) {
  if (const std::string why = no_gpu_reason(); !why.empty()) GTEST_SKIP() << why;
  const std::string model = GetParam();
  Context ctx(ContextOptions{LogLevel::kError, 2});
  BuildOptions fo;
  fo.prompt_template = template_of(model);
  const auto fp32 = compile_model_dir(ctx, fixture(model), fo);
  const CalibrationCache cache = calibrate(ctx, model, 256);
  const auto cpu = build_int8(ctx, fixture(model), model, cache, "test");
  const auto cuda = build_int8(ctx, fixture(model), model, cache, "test", Device::kCuda);
  const std::vector<DevRow> rows = dev_rows(5);
  const auto f = generate(*fp32, rows);
  const auto c = generate(*cpu, rows);
  const auto g = generate(*cuda, rows);
  const int first_agree = first_tokens_agree(c, g);
  const int fp32_right = exact_matches(*fp32, rows, f), cuda_right = exact_matches(*cuda, rows, g);
  const double n = static_cast<double>(rows.size());
  std::cout << "  [" << model << " cuda int8: " << cuda_right << " of " << rows.size()
            << " rows right (fp32 " << fp32_right << "), first token as the cpu int8 plan's on "
            << first_agree << "]\n";
  EXPECT_GE(cuda_right / n, fp32_right / n - 0.05);
  EXPECT_GE(first_agree / n, 0.9);
}

// A cuda fp8 plan (built here, no GPU needed) from the same cache: E4M3 weights with per-channel
// scales in every Linear that reads a quantized input, its scale the cache's threshold over 448
// (the int8 scale · 127 / 448); the logits Linear, the Embedding and fp16 T5's FFN output
// projections (f32 inputs) keep int8 weights, with why.
TEST_P(Int8Plan, ACudaFp8PlanStoresE4M3WeightsWithTheCalibratedScales) {
  const std::string model = GetParam();
  Context ctx(ContextOptions{LogLevel::kError, 2});
  const CalibrationCache cache = calibrate(ctx, model, 32);
  BuildOptions o = calibrated_options(model, cache, "test", Device::kCuda);
  o.precision = Precision::kFp8;
  const ModelIR ir = build_model(fixture(model), o, ctx.log());
  int fp8 = 0, int8 = 0;
  for (const Graph& g : ir.graphs)
    for (const Node& n : g.nodes) {
      if (n.op != OpKind::kLinear) continue;
      const Value& w = g.values[linear_operand(n, LinearOperand::kWeight)];
      const int x = linear_operand(n, LinearOperand::kX);
      const int s = linear_operand(n, LinearOperand::kInputScale);
      if (w.dtype == DType::kI8) {
        ++int8;
        EXPECT_LT(s, 0) << n.name << ": an int8 Linear of an fp8 plan reads its float input";
        continue;
      }
      ASSERT_EQ(w.dtype, DType::kF8E4M3) << n.name;
      ++fp8;
      ASSERT_GE(s, 0) << n.name;
      const Value& scales = g.values[linear_operand(n, LinearOperand::kWeightScales)];
      ASSERT_EQ(scales.dtype, DType::kF32) << n.name;
      ASSERT_EQ(scales.data.numel(), w.shape[0].value) << n.name;
      const float* cached = cached_scale(cache, g, x);
      ASSERT_NE(cached, nullptr) << n.name;
      EXPECT_EQ(g.values[s].data.data<float>()[0], fp8_scale_from_int8(*cached)) << n.name;
    }
  EXPECT_GT(fp8, 8);
  EXPECT_EQ(int8, model == "bloom-tiny" ? 1 : 9);
}

// On the GPU (skipped without one, or on one older than sm_89), the cuda fp8 plan answers within
// five points of the fp32 plan on a fifth of the dev set, and agrees with its first token on nine
// rows in ten.
TEST_P(Int8Plan, ACudaFp8PlanGeneratesCloseToTheFp32Plan) {
  if (const std::string why = no_gpu_reason(); !why.empty()) GTEST_SKIP() << why;
  if (const std::string why = target_unsupported_reason(Device::kCuda, Precision::kFp8);
      !why.empty())
    GTEST_SKIP() << why;
  const std::string model = GetParam();
  Context ctx(ContextOptions{LogLevel::kError, 2});
  BuildOptions fo;
  fo.prompt_template = template_of(model);
  const auto fp32 = compile_model_dir(ctx, fixture(model), fo);
  BuildOptions o = calibrated_options(model, calibrate(ctx, model, 256), "test", Device::kCuda);
  o.precision = Precision::kFp8;
  const auto fp8 = compile_model_dir(ctx, fixture(model), o);
  const std::vector<DevRow> rows = dev_rows(5);
  const auto f = generate(*fp32, rows);
  const auto q = generate(*fp8, rows);
  const int first_agree = first_tokens_agree(f, q);
  const int fp32_right = exact_matches(*fp32, rows, f), fp8_right = exact_matches(*fp8, rows, q);
  const double n = static_cast<double>(rows.size());
  std::cout << "  [" << model << " cuda fp8: " << fp8_right << " of " << rows.size()
            << " rows right (fp32 " << fp32_right << "), first token as fp32's on " << first_agree
            << "]\n";
  EXPECT_GE(fp8_right / n, fp32_right / n - 0.05);
  EXPECT_GE(first_agree / n, 0.9);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, Int8Plan, testing::Values("t5-tiny", "bloom-tiny"),
                         [](const testing::TestParamInfo<std::string>& info) {
                           return info.param == "t5-tiny" ? std::string("T5")
                                                          : std::string("Bloom");
                         });

// A cache made for another model is refused naming the fingerprints: the other fixture, and the
// same checkpoint with one weight changed (same shapes, config and tokenizer: the fingerprint
// covers the weights' content). A byte-identical copy elsewhere is the same model.
TEST(Int8Calibration, AForeignCacheIsRefused) {
  Context ctx(ContextOptions{LogLevel::kError, 2});
  const CalibrationCache t5 = calibrate(ctx, "t5-tiny", 16);
  auto expect_refused = [&](const std::string& dir, const std::string& model,
                            const CalibrationCache& cache, const std::string& what) {
    try {
      build_int8(ctx, dir, model, cache, "foreign.calib");
      ADD_FAILURE() << "built " << dir << " from a foreign cache";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kUsage) << e.what();
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("foreign.calib"), std::string::npos) << e.what();
    }
  };
  expect_refused(fixture("bloom-tiny"), "bloom-tiny", t5, "another model");

  // The same files elsewhere: accepted. One weight changed: refused.
  const std::string copy = temp_path("t5-tiny-copy"), edited = temp_path("t5-tiny-edited");
  for (const std::string& dir : {copy, edited}) {
    fs::remove_all(dir);
    fs::create_directories(dir);
    for (const auto& e : fs::directory_iterator(fixture("t5-tiny")))
      fs::copy_file(e.path(), dir + "/" + e.path().filename().string());
  }
  EXPECT_NO_THROW(build_int8(ctx, copy, "t5-tiny", t5, "copy"));
  {
    const Checkpoint ckpt = Checkpoint::open_dir(fixture("t5-tiny"));
    std::map<std::string, Tensor> tensors;
    for (const auto& [name, t] : ckpt.tensors()) tensors[name] = t.clone();
    Tensor& w = tensors.begin()->second;
    ASSERT_EQ(w.dtype(), DType::kF32);
    w.data<float>()[0] += 0.25f;
    fs::remove(edited + "/model.safetensors");
    write_safetensors(edited + "/model.safetensors", tensors);
  }
  expect_refused(edited, "t5-tiny", t5, "another model");

  // A cache that lacks a tensor, or names one the model does not have.
  CalibrationCache missing = t5;
  const std::string first = missing.scales.begin()->first;
  missing.scales.erase(missing.scales.begin());
  expect_refused(fixture("t5-tiny"), "t5-tiny", missing, "missing " + first);
  CalibrationCache extra = t5;
  extra.scales["decoder/nowhere"] = 0.5f;
  expect_refused(fixture("t5-tiny"), "t5-tiny", extra, "decoder/nowhere");
}

// int8 without calibration data is refused before any work, saying what to pass; a calibration
// given to another precision is refused; cuda int8 needs a calibration as the cpu's does.
TEST(Int8Calibration, RefusalsSayWhatToPass) {
  Context ctx(ContextOptions{LogLevel::kError, 1});
  try {
    build_model(fixture("t5-tiny"), int8_options("t5-tiny"), ctx.log());
    FAIL() << "int8 was built without calibration";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUsage);
    for (const char* what : {"--calib FILE.jsonl", "--calib-cache FILE"})
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
  }
  BuildOptions bf16;
  bf16.precision = Precision::kBf16;
  bf16.precision_options.calibration = CalibrationCache{};
  bf16.precision_options.calibration_source = "x.calib";
  EXPECT_THROW(build_model(fixture("t5-tiny"), bf16, ctx.log()), Error);
  // CUDA int8 (W8A8) needs a calibration as the CPU's does.
  const PrecisionSupport& cuda = precision_support(Device::kCuda, Precision::kInt8);
  EXPECT_TRUE(cuda.supported && cuda.calibrated_inputs);
  EXPECT_EQ(cuda.activation, DType::kF16);
  BuildOptions cuda_int8 = int8_options("t5-tiny");
  cuda_int8.device = Device::kCuda;
  EXPECT_THROW(build_model(fixture("t5-tiny"), cuda_int8, ctx.log()), Error);
  EXPECT_TRUE(precision_support(Device::kCpu, Precision::kInt8).calibrated_inputs);
}

}  // namespace
}  // namespace kiln::test
