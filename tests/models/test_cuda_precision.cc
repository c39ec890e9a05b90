// fp16, bf16 and int8-weight plans of the fixture models on CUDA against HuggingFace's fp32
// references (issue 9): greedy ids equal HF's on at least all but one of the reference cases per
// model, logits finite and close to HF's in cosine, and a padded batch equal to the cases run
// alone. fp16 plans with an fp8 KV cache (--kv-cache fp8: keys and values keep 3 mantissa bits)
// the same within all but two cases and a cosine of 0.99. Skipped, saying why, without a GPU.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>

#include "backend/cuda_info.h"
#include "builder/builder.h"
#include "io/safetensors.h"
#include "model_runner.h"
#include "parity_util.h"
#include "runtime/scheduler.h"

namespace kiln::test {
namespace {

struct PrecisionCase {
  std::string dir;
  bool t5;
  Precision precision;
  KvCache kv_cache = KvCache::kAuto;
};

class CudaPrecision : public testing::TestWithParam<PrecisionCase> {
 protected:
  void SetUp() override {
    if (const std::string why = no_gpu_reason(); !why.empty())
      GTEST_SKIP() << why << ": fp16/bf16 plans run on the GPU machine";
    ctx_ = std::make_unique<Context>(ContextOptions{LogLevel::kWarning, 2});
    BuildOptions options;
    options.device = Device::kCuda;
    options.precision = GetParam().precision;
    options.kv_cache = GetParam().kv_cache;
    engine_ = compile_model_dir(*ctx_, fixture(GetParam().dir), options);
    ref_ = std::make_unique<SafetensorsFile>(
        SafetensorsFile::open(fixture(GetParam().dir + "/reference.safetensors")));
  }
  const Tensor& ref(const std::string& name) const { return ref_->tensors().at(name); }
  int cases() const {
    int n = 0;
    while (ref_->tensors().count("case" + std::to_string(n) + ".input_ids")) ++n;
    return n;
  }
  std::vector<int64_t> hf_generated(const std::string& name, size_t prompt_len) const {
    std::vector<int64_t> ids = ids_of(ref(name));
    ids.erase(ids.begin(),
              ids.begin() + static_cast<std::ptrdiff_t>(GetParam().t5 ? 1 : prompt_len));
    return strip_generated(ids, engine_->desc().eos_token_ids.at(0), engine_->desc().pad_token_id);
  }

  std::unique_ptr<Context> ctx_;
  std::unique_ptr<CompiledModel> engine_;
  std::unique_ptr<SafetensorsFile> ref_;
};

TEST_P(CudaPrecision, GreedyIdsMatchHuggingFaceOnAllButOneCase) {
  ASSERT_GE(cases(), 9);
  Scheduler gen(*engine_);
  GenerationParams p;
  p.max_new_tokens = 16;
  int equal = 0;
  std::vector<std::vector<int64_t>> prompts;
  std::vector<std::vector<int64_t>> alone;
  for (int c = 0; c < cases(); ++c) {
    const std::string k = "case" + std::to_string(c);
    prompts.push_back(ids_of(ref(k + ".input_ids")));
    alone.push_back(gen.generate({prompts.back()}, p)[0].output_ids);
    const bool same = alone.back() == hf_generated(k + ".greedy_ids", prompts.back().size());
    equal += same;
    if (!same)
      std::printf("[precision] %s %s: %s greedy ids differ from HF's\n", GetParam().dir.c_str(),
                  std::string(precision_name(GetParam().precision)).c_str(), k.c_str());
  }
  std::printf("[precision] %s %s: greedy ids equal to HF fp32 on %d of %d cases\n",
              GetParam().dir.c_str(), std::string(precision_name(GetParam().precision)).c_str(),
              equal, cases());
  EXPECT_GE(equal, cases() - (GetParam().kv_cache == KvCache::kFp8 ? 2 : 1));
  // All cases as one batch: each sequence's ids equal its run alone.
  const auto batched = gen.generate(prompts, p);
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(batched[i].output_ids, alone[i]) << "case " << i;
  EXPECT_EQ(gen.kv_blocks_in_use(), 0);
}

TEST_P(CudaPrecision, LogitsAreFiniteAndCloseToHuggingFace) {
  double worst_cosine = 1.0, worst_error = 0.0;
  for (int c = 0; c < cases(); ++c) {
    const std::string k = "case" + std::to_string(c);
    std::vector<int64_t> seq = ids_of(ref(k + ".greedy_ids"));
    seq.pop_back();
    const Forward f = run_forward(*engine_, ids_of(ref(k + ".input_ids")), seq, false);
    const Tensor& hf = ref(k + ".logits");
    const int64_t rows = f.logits.dim(0), vocab = f.logits.dim(1);
    for (int64_t i = 0; i < f.logits.numel(); ++i)
      ASSERT_TRUE(std::isfinite(f.logits.data<float>()[i])) << k << " element " << i;
    for (int64_t r = 0; r < rows; ++r)
      worst_cosine = std::min(worst_cosine, cosine(f.logits.data<float>() + r * vocab,
                                                   hf.data<float>() + r * vocab, vocab));
    worst_error = std::max(worst_error, relative_error(f.logits, hf));
  }
  std::printf("[precision] %s %s: logits cosine >= %.6f, max relative error %.3g\n",
              GetParam().dir.c_str(), std::string(precision_name(GetParam().precision)).c_str(),
              worst_cosine, worst_error);
  EXPECT_GE(worst_cosine, GetParam().kv_cache == KvCache::kFp8 ? 0.99 : 0.999);
}

INSTANTIATE_TEST_SUITE_P(
    Models, CudaPrecision,
    testing::Values(PrecisionCase{"t5-tiny", true, Precision::kFp16},
                    PrecisionCase{"t5-tiny", true, Precision::kBf16},
                    PrecisionCase{"bloom-tiny", false, Precision::kFp16},
                    PrecisionCase{"bloom-tiny", false, Precision::kBf16},
                    PrecisionCase{"t5-tiny", true, Precision::kInt8Weight},
                    PrecisionCase{"bloom-tiny", false, Precision::kInt8Weight},
                    PrecisionCase{"t5-tiny", true, Precision::kFp16, KvCache::kFp8},
                    PrecisionCase{"bloom-tiny", false, Precision::kFp16, KvCache::kFp8}),
    [](const auto& info) {
      std::string p(precision_name(info.param.precision));
      std::replace(p.begin(), p.end(), '-', '_');
      return std::string(info.param.t5 ? "T5" : "Bloom") + "_" + p +
             (info.param.kv_cache == KvCache::kFp8 ? "_kv_fp8" : "");
    });

// fp16 T5 overflow (issue 9): the fixture T5 with its FFN output projections `wo` scaled up
// so that the residual stream leaves fp16's range (the scaled copy is kept in the test folder
// for bench/gpu/run.sh to show HF's numbers on it). The fp16 plan keeps the stream in f32: its
// logits stay finite and its greedy ids equal the fp32 plan's.
TEST(CudaFp16Overflow, T5ResidualStreamStaysFiniteAndMatchesFp32) {
  const CudaInfo cuda = query_cuda();
  if (cuda.device_count == 0) GTEST_SKIP() << "no GPU visible: fp16 plans run on the GPU machine";
  namespace fs = std::filesystem;
  const std::string dir = std::string(KILN_TEST_TMP) + "/fp16_overflow_t5";
  fs::remove_all(dir);
  fs::create_directories(dir);
  for (const auto& f : fs::directory_iterator(fixture("t5-tiny")))
    if (f.path().filename() != "model.safetensors")
      fs::copy(f.path(), dir + "/" + f.path().filename().string());
  const SafetensorsFile src = SafetensorsFile::open(fixture("t5-tiny/model.safetensors"));
  std::map<std::string, Tensor> scaled;
  constexpr float kScale = 16000.0f;
  for (const auto& [name, t] : src.tensors()) {
    Tensor c = t.to(DType::kF32);
    if (name.size() > 10 && name.compare(name.size() - 10, 10, ".wo.weight") == 0)
      for (int64_t i = 0; i < c.numel(); ++i) c.data<float>()[i] *= kScale;
    scaled.emplace(name, c);
  }
  write_safetensors(dir + "/model.safetensors", scaled, {{"format", "pt"}});

  Context ctx(ContextOptions{LogLevel::kWarning, 2});
  BuildOptions o32;
  o32.device = Device::kCuda;
  BuildOptions o16 = o32;
  o16.precision = Precision::kFp16;
  auto fp32 = compile_model_dir(ctx, dir, o32);
  auto fp16 = compile_model_dir(ctx, dir, o16);
  const SafetensorsFile ref = SafetensorsFile::open(fixture("t5-tiny/reference.safetensors"));
  double largest = 0.0;
  int equal = 0, cases = 0;
  Scheduler g32(*fp32), g16(*fp16);
  GenerationParams p;
  p.max_new_tokens = 16;
  for (; ref.tensors().count("case" + std::to_string(cases) + ".input_ids"); ++cases) {
    const std::vector<int64_t> prompt =
        ids_of(ref.tensors().at("case" + std::to_string(cases) + ".input_ids"));
    const Forward f = run_forward(*fp16, prompt, {0, 5, 9}, false);
    for (int64_t i = 0; i < f.logits.numel(); ++i) {
      ASSERT_TRUE(std::isfinite(f.logits.data<float>()[i])) << "case " << cases << " logit " << i;
      largest = std::max(largest, std::abs(double(f.logits.data<float>()[i])));
    }
    equal += g32.generate({prompt}, p)[0].output_ids == g16.generate({prompt}, p)[0].output_ids;
  }
  std::printf(
      "[precision] t5-tiny with wo x%.0f, fp16: logits finite (max |logit| %.3g), greedy "
      "ids equal to the fp32 plan's on %d of %d cases\n",
      kScale, largest, equal, cases);
  ASSERT_GE(cases, 9);
  EXPECT_GE(equal, cases - 1);
}

}  // namespace
}  // namespace kiln::test
