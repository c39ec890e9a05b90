// An fp8 KV cache (`kiln build --kv-cache fp8`) by its definition, on the CPU: the reference
// backend, which stores each key and value as E4M3 (scale 1, saturating at ±448) and reads it
// back, runs both fixture models' reference cases with an fp8 cache and with an f32 one, against
// HuggingFace's fp32 logits. What E4M3's 3 mantissa bits cost here is what the CUDA kernels are
// held to (their op test, test_backend_attention_fp8_kv.cc, and CudaPrecision's *_kv_fp8 cases
// on the GPU: greedy ids on all but two cases, logits cosine 0.99).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "backend/reference/reference_backend.h"
#include "builder/builder.h"
#include "model_runner.h"
#include "parity_util.h"

namespace kiln::test {
namespace {

class Fp8KvCache : public testing::TestWithParam<std::string> {};

// The index of the largest of n logits.
int64_t argmax(const float* row, int64_t n) { return std::max_element(row, row + n) - row; }

TEST_P(Fp8KvCache, ReferenceBackendStaysCloseToHuggingFace) {
  Context ctx(ContextOptions{LogLevel::kWarning, 1});
  const ModelIR model = build_model(fixture(GetParam()), BuildOptions{}, ctx.log());
  std::unique_ptr<Backend> backend = make_reference_backend(ctx);
  ASSERT_EQ(backend->kv_cache_dtype(DType::kF32, Precision::kFp32, KvCache::kFp8), DType::kF8E4M3);
  std::unique_ptr<Executable> encoder;
  if (model.desc.encoder_decoder)
    encoder = backend->compile(model.graph(kEncoderGraph), model.profile);
  std::unique_ptr<Executable> decoder = backend->compile(model.graph(kDecoderGraph), model.profile);
  const ForwardModel f32_cache{model, *backend, encoder.get(), *decoder, DType::kF32};
  const ForwardModel f8_cache{model, *backend, encoder.get(), *decoder, DType::kF8E4M3};

  const SafetensorsFile ref = SafetensorsFile::open(fixture(GetParam() + "/reference.safetensors"));
  int cases = 0;
  while (ref.tensors().count("case" + std::to_string(cases) + ".input_ids")) ++cases;
  ASSERT_GE(cases, 9);
  double worst_cosine = 1.0, worst_f32_error = 0.0, worst_f8_error = 0.0;
  int positions = 0, agree = 0, differ_from_f32 = 0;
  for (int c = 0; c < cases; ++c) {
    const std::string k = "case" + std::to_string(c);
    std::vector<int64_t> seq = ids_of(ref.tensors().at(k + ".greedy_ids"));
    seq.pop_back();  // logits are of greedy_ids[:-1]
    const std::vector<int64_t> prompt = ids_of(ref.tensors().at(k + ".input_ids"));
    const Tensor& hf = ref.tensors().at(k + ".logits");
    // One token per step for the first case (each key read back from the cache by later steps),
    // the whole sequence in one step for the others (its keys read back within the step).
    const Forward a = run_forward(f32_cache, prompt, seq, c == 0);
    const Forward b = run_forward(f8_cache, prompt, seq, c == 0);
    worst_f32_error = std::max(worst_f32_error, relative_error(a.logits, hf));
    worst_f8_error = std::max(worst_f8_error, relative_error(b.logits, hf));
    const int64_t rows = b.logits.dim(0), vocab = b.logits.dim(1);
    for (int64_t r = 0; r < rows; ++r) {
      const float* got = b.logits.data<float>() + r * vocab;
      worst_cosine = std::min(worst_cosine, cosine(got, hf.data<float>() + r * vocab, vocab));
      agree += argmax(got, vocab) == argmax(hf.data<float>() + r * vocab, vocab);
      ++positions;
    }
    differ_from_f32 += relative_error(b.logits, a.logits) > 0.0;
  }
  std::printf(
      "[kv fp8] %s: logits cosine to HF >= %.6f, max relative error %.3g (f32 cache "
      "%.3g); next token as HF's at %d of %d positions\n",
      GetParam().c_str(), worst_cosine, worst_f8_error, worst_f32_error, agree, positions);
  // The f32 cache is the parity path; E4M3 moves every case's logits, by far less than a token.
  EXPECT_LE(worst_f32_error, 1e-4);
  EXPECT_EQ(differ_from_f32, cases) << "the fp8 cache changed nothing: it was not used";
  EXPECT_GE(worst_cosine, 0.99);
  EXPECT_GE(agree, positions - 2);
}

INSTANTIATE_TEST_SUITE_P(Models, Fp8KvCache, testing::Values("t5-tiny", "bloom-tiny"),
                         [](const auto& info) {
                           return info.param == "t5-tiny" ? std::string("T5")
                                                          : std::string("Bloom");
                         });

}  // namespace
}  // namespace kiln::test
