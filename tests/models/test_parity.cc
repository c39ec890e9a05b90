// HF parity for both fixture models: logits, encoder states, greedy and beam ids, padded batches.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>

#include "builder/builder.h"
#include "model_runner.h"
#include "parity_util.h"
#include "runtime/scheduler.h"

namespace kiln::test {
namespace {

struct ModelCase {
  std::string dir;
  bool t5;
  Device device = Device::kCpu;
};

// Logits parity relative to max |logit|: DESIGN.md's 1e-4 on the CPU; issue 9's 1e-3 on CUDA
// (cuBLASLt sums in another order, and its fp32 GEMMs may use fused multiply-adds in blocks).
double logits_tolerance(Device device) { return device == Device::kCpu ? 1e-4 : 1e-3; }

class Parity : public testing::TestWithParam<ModelCase> {
 protected:
  void SetUp() override {
    if (GetParam().device == Device::kCuda)
      if (const std::string why = no_gpu_reason(); !why.empty())
        GTEST_SKIP() << why << ": the CUDA parity runs on the GPU machine";
    ctx_ = std::make_unique<Context>(ContextOptions{LogLevel::kWarning, 2});
    BuildOptions options;
    options.device = GetParam().device;
    engine_ = compile_model_dir(*ctx_, fixture(GetParam().dir), options);
    ref_ = std::make_unique<SafetensorsFile>(
        SafetensorsFile::open(fixture(GetParam().dir + "/reference.safetensors")));
  }
  const Tensor& ref(const std::string& name) const { return ref_->tensors().at(name); }
  bool has(const std::string& name) const { return ref_->tensors().count(name) != 0; }
  int cases() const {
    int n = 0;
    while (has("case" + std::to_string(n) + ".input_ids")) ++n;
    return n;
  }
  int64_t eos() const { return engine_->desc().eos_token_ids.at(0); }
  int64_t pad() const { return engine_->desc().pad_token_id; }
  // The ids HF generated after the prompt (T5: after the start token), EOS removed.
  std::vector<int64_t> hf_generated(const std::string& name, size_t prompt_len) const {
    std::vector<int64_t> ids = ids_of(ref(name));
    const size_t skip = GetParam().t5 ? 1 : prompt_len;
    ids.erase(ids.begin(), ids.begin() + static_cast<std::ptrdiff_t>(skip));
    return strip_generated(ids, eos(), pad());
  }

  std::unique_ptr<Context> ctx_;
  std::unique_ptr<CompiledModel> engine_;
  std::unique_ptr<SafetensorsFile> ref_;
};

TEST_P(Parity, LogitsMatchHuggingFace) {
  ASSERT_GE(cases(), 9);
  double worst = 0.0;
  for (int c = 0; c < cases(); ++c) {
    const std::string k = "case" + std::to_string(c);
    const std::vector<int64_t> prompt = ids_of(ref(k + ".input_ids"));
    std::vector<int64_t> seq = ids_of(ref(k + ".greedy_ids"));
    seq.pop_back();  // logits are of greedy_ids[:-1]
    for (bool step : {false, true}) {
      const Forward f = run_forward(*engine_, prompt, seq, step);
      const double tol = logits_tolerance(GetParam().device);
      const double err = relative_error(f.logits, ref(k + ".logits"));
      worst = std::max(worst, err);
      EXPECT_LE(err, tol) << k << (step ? " (one token per step)" : " (one pass)");
      if (GetParam().t5) {
        EXPECT_LE(relative_error(f.encoder_hidden, ref(k + ".encoder_hidden")), tol) << k;
      }
    }
  }
  RecordProperty("max_relative_logits_error", std::to_string(worst));
  std::printf("[parity] %s on %s: max relative logits error %.3g\n", GetParam().dir.c_str(),
              std::string(device_name(GetParam().device)).c_str(), worst);
}

// Generation and single forwards interleaved on one engine, each with its own KV storage (the
// scheduler's blocks of 16, the forward's of 4) created and freed in turn: nothing a step left
// behind (a CUDA graph captured for a storage at the same address) may leak into the next.
TEST_P(Parity, ForwardsBetweenGenerationsMatchHuggingFace) {
  for (int c = 0; c < cases(); ++c) {
    const std::string k = "case" + std::to_string(c);
    const std::vector<int64_t> prompt = ids_of(ref(k + ".input_ids"));
    {
      Scheduler gen(*engine_);
      GenerationParams p;
      p.max_new_tokens = 16;
      EXPECT_EQ(gen.generate({prompt}, p)[0].output_ids,
                hf_generated(k + ".greedy_ids", prompt.size()))
          << k;
    }
    std::vector<int64_t> seq = ids_of(ref(k + ".greedy_ids"));
    seq.pop_back();
    const Forward f = run_forward(*engine_, prompt, seq, false);
    EXPECT_LE(relative_error(f.logits, ref(k + ".logits")), logits_tolerance(GetParam().device))
        << k;
  }
}

TEST_P(Parity, GreedyIdsMatchHuggingFace) {
  Scheduler gen(*engine_);
  GenerationParams p;
  p.max_new_tokens = 16;
  for (int c = 0; c < cases(); ++c) {
    const std::string k = "case" + std::to_string(c);
    const std::vector<int64_t> prompt = ids_of(ref(k + ".input_ids"));
    const auto out = gen.generate({prompt}, p);
    EXPECT_EQ(out[0].output_ids, hf_generated(k + ".greedy_ids", prompt.size())) << k;
  }
  EXPECT_EQ(gen.kv_blocks_in_use(), 0) << "finished requests must return their KV blocks";
}

TEST_P(Parity, BeamSearchIdsMatchHuggingFace) {
  Scheduler gen(*engine_);
  GenerationParams p;
  p.max_new_tokens = 16;
  p.num_beams = 4;
  p.early_stopping = EarlyStopping::kAlways;  // as the fixtures were made
  for (int c = 0; c < cases(); ++c) {
    const std::string k = "case" + std::to_string(c);
    const std::vector<int64_t> prompt = ids_of(ref(k + ".input_ids"));
    const auto out = gen.generate({prompt}, p);
    EXPECT_EQ(out[0].output_ids, hf_generated(k + ".beam4_ids", prompt.size())) << k;
  }
  EXPECT_EQ(gen.kv_blocks_in_use(), 0);
}

// The padded HF batch, run as one kiln batch: every row equals HF's batched row and the
// per-case result.
TEST_P(Parity, PaddedBatchMatchesPerCase) {
  const Tensor& input = ref("batch.input_ids");
  const Tensor& greedy = ref("batch.greedy_ids");
  const int64_t rows = input.dim(0), width = input.dim(1), gwidth = greedy.dim(1);
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int64_t> row(input.data<int64_t>() + r * width,
                             input.data<int64_t>() + (r + 1) * width);
    if (GetParam().t5) {
      const std::vector<int64_t> case_ids = ids_of(ref("case" + std::to_string(r) + ".input_ids"));
      row.resize(case_ids.size());  // right padding: keep the prompt's own length
    } else {
      const Tensor& mask = ref("batch.attention_mask");
      std::vector<int64_t> kept;
      for (int64_t i = 0; i < width; ++i)
        if (mask.data<int64_t>()[r * width + i] != 0) kept.push_back(row[i]);
      row = kept;  // left padding removed: kiln batches are ragged
    }
    EXPECT_EQ(row, ids_of(ref("case" + std::to_string(r) + ".input_ids"))) << "row " << r;
    prompts.push_back(row);
  }
  Scheduler gen(*engine_);
  GenerationParams p;
  p.max_new_tokens = 16;
  const auto batched = gen.generate(prompts, p);
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<int64_t> hf(greedy.data<int64_t>() + r * gwidth,
                            greedy.data<int64_t>() + (r + 1) * gwidth);
    const size_t skip = GetParam().t5 ? 1 : static_cast<size_t>(width);
    hf.erase(hf.begin(), hf.begin() + static_cast<std::ptrdiff_t>(skip));
    EXPECT_EQ(batched[r].output_ids, strip_generated(hf, eos(), pad())) << "row " << r;
    const auto single = gen.generate({prompts[r]}, p);
    EXPECT_EQ(batched[r].output_ids, single[0].output_ids) << "row " << r;
  }
}

// Requests that join a running batch mid-generation get exactly their unbatched output.
TEST_P(Parity, RequestsJoiningMidGenerationMatchUnbatched) {
  std::vector<std::vector<int64_t>> prompts;
  for (int c = 0; c < cases(); ++c)
    prompts.push_back(ids_of(ref("case" + std::to_string(c) + ".input_ids")));
  GenerationParams greedy;
  greedy.max_new_tokens = 16;
  GenerationParams beam = greedy;
  beam.num_beams = 3;
  std::vector<GenerationResult> alone;
  {
    Scheduler g(*engine_);
    for (size_t i = 0; i < prompts.size(); ++i)
      alone.push_back(g.generate({prompts[i]}, i % 3 == 2 ? beam : greedy)[0]);
  }
  Scheduler gen(*engine_);
  std::map<RequestId, size_t> which;
  std::vector<GenerationResult> got(prompts.size());
  size_t next = 0, done = 0;
  int steps = 0;
  while (done < prompts.size()) {
    // One new request every other step, so requests join while others are mid-generation.
    if (next < prompts.size() && steps % 2 == 0) {
      which[gen.submit(prompts[next], next % 3 == 2 ? beam : greedy)] = next;
      ++next;
    }
    ++steps;
    for (GenerationEvent& e : gen.step()) {
      if (!e.finished) continue;
      ASSERT_TRUE(e.error.empty()) << e.error;
      got[which.at(e.id)] = e.result;
      ++done;
    }
  }
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(got[i].output_ids, alone[i].output_ids) << "request " << i;
  EXPECT_EQ(gen.kv_blocks_in_use(), 0);
}

// Sampling (temperature, top-k, top-p) and beams with min_new_tokens, where a device picks each
// row's best tokens itself (TokenSelector::top_k_rows), draw what the CPU draws for the same seeds.
// fp32 logits agree to about 1e-6, so a draw could only differ if it fell that close to the
// edge of a token's probability interval; with fixed seeds the outcome is fixed.
TEST_P(Parity, DeviceSamplingAndBeamsMatchTheCpu) {
  if (GetParam().device == Device::kCpu) GTEST_SKIP() << "compares a device with the CPU";
  Context cpu_ctx(ContextOptions{LogLevel::kWarning, 2});
  const auto cpu = compile_model_dir(cpu_ctx, fixture(GetParam().dir), BuildOptions{});
  std::vector<GenerationParams> params;
  for (int i = 0; i < 4; ++i) {
    GenerationParams p;
    p.max_new_tokens = 12;
    p.do_sample = true;
    p.seed = 100 + i;
    p.temperature = 0.6f + 0.3f * i;
    p.top_k = i == 3 ? 5 : 50;
    p.top_p = i == 2 ? 0.8f : 1.0f;
    p.min_new_tokens = i == 1 ? 6 : 0;
    params.push_back(p);
  }
  GenerationParams beam;
  beam.max_new_tokens = 10;
  beam.num_beams = 3;
  beam.min_new_tokens = 5;
  params.push_back(beam);
  Scheduler on_device(*engine_), on_cpu(*cpu);
  for (int c = 0; c < cases(); ++c) {
    const std::vector<int64_t> prompt = ids_of(ref("case" + std::to_string(c) + ".input_ids"));
    for (size_t i = 0; i < params.size(); ++i) {
      const auto want = on_cpu.generate({prompt}, params[i]);
      const auto got = on_device.generate({prompt}, params[i]);
      EXPECT_EQ(got[0].output_ids, want[0].output_ids) << "case " << c << " params " << i;
      if (params[i].min_new_tokens > 0) {
        EXPECT_GE(got[0].output_ids.size(), static_cast<size_t>(params[i].min_new_tokens));
      }
    }
  }
  EXPECT_EQ(on_device.kv_blocks_in_use(), 0);
}

INSTANTIATE_TEST_SUITE_P(Models, Parity,
                         testing::Values(ModelCase{"t5-tiny", true},
                                         ModelCase{"bloom-tiny", false}),
                         [](const auto& info) { return info.param.t5 ? "T5" : "Bloom"; });
// The same checks on the CUDA backend (skipped, saying why, without a GPU).
INSTANTIATE_TEST_SUITE_P(CudaModels, Parity,
                         testing::Values(ModelCase{"t5-tiny", true, Device::kCuda},
                                         ModelCase{"bloom-tiny", false, Device::kCuda}),
                         [](const auto& info) { return info.param.t5 ? "T5" : "Bloom"; });

}  // namespace
}  // namespace kiln::test
