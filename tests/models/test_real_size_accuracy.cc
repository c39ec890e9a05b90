// Accuracy of the narrow CPU precisions at real size: synthesized bloom-560m and flan-t5-base
// (`kiln synth`: the public shapes, random weights), each built as an fp32 plan and as bf16, fp16
// and int8-weight plans (the latter in f32 FMAs and, where the CPU has AVX512-VNNI, in int8 dot
// products); the last token's logits of a prompt must have cosine similarity >= 0.999 with the
// fp32 plan's. The prompt is long enough (80 tokens) that prefill takes the GEMM paths
// (>= 64 rows: oneDNN sgemm for fp32, oneDNN's bf16 matmul for bf16). The one-row decode kernels
// are checked against the one-pass forward in test_precision.cc (the int8 dot products quantize
// each row alike at every row count).
//
// The checkpoints are written once per test run into KILN_TEST_TMP (2.2 GB for bloom-560m, read
// back by mmap). Suite name RealSize: `ctest -R RealSize` runs it alone.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "builder/builder.h"
#include "frontend/hf/synth.h"
#include "model_runner.h"
#include "parity_util.h"

namespace kiln::test {
namespace {

struct RealSizeCase {
  std::string preset;
};

std::string case_name(const testing::TestParamInfo<RealSizeCase>& info) {
  std::string p = info.param.preset;
  std::replace(p.begin(), p.end(), '-', '_');
  return p;
}

std::string synthesized(const std::string& preset) {
  const std::string dir = std::string(KILN_TEST_TMP) + "/real_size_" + preset;
  if (!std::filesystem::exists(dir + "/model.safetensors")) {
    SynthOptions options;
    options.seed = 7;
    synthesize_checkpoint(find_synth_preset(preset), dir, options, [](int64_t, int64_t) {});
  }
  return dir;
}

class RealSize : public testing::TestWithParam<RealSizeCase> {};

TEST_P(RealSize, NarrowPrecisionLogitsFollowFp32) {
  const std::string dir = synthesized(GetParam().preset);
  Context ctx(ContextOptions{LogLevel::kWarning, 0});
  const std::unique_ptr<CompiledModel> fp32 = compile_model_dir(ctx, dir);
  const ModelDesc& d = fp32->desc();
  // Ids the tokenizer knows (the fixture's), well inside every vocabulary.
  std::mt19937 rng(3);
  std::vector<int64_t> prompt(80);
  for (int64_t& id : prompt) id = 5 + static_cast<int64_t>(rng() % 250);
  std::vector<int64_t> decoder_ids = d.encoder_decoder ? std::vector<int64_t>(80) : prompt;
  if (d.encoder_decoder) {
    decoder_ids[0] = d.decoder_start_token_id;
    for (size_t i = 1; i < decoder_ids.size(); ++i) decoder_ids[i] = prompt[i - 1];
  }
  const Forward ref = run_forward(*fp32, prompt, decoder_ids, false);
  const int64_t v = d.vocab_size, last = static_cast<int64_t>(decoder_ids.size()) - 1;
  // int8-weight twice where the CPU has AVX512-VNNI: in int8 dot products (activations
  // quantized per row in groups of 128; the default there) and in f32 FMAs (the path of every other
  // CPU).
  ContextOptions fma_options{LogLevel::kWarning, 0};
  fma_options.cpu_int8_dot = false;
  Context fma_ctx(fma_options);
  struct Variant {
    Precision precision;
    Context* context;
    std::string name;
  };
  std::vector<Variant> variants = {{Precision::kBf16, &ctx, "bf16"},
                                   {Precision::kFp16, &ctx, "fp16"},
                                   {Precision::kInt8Weight, &fma_ctx, "int8-weight (f32 FMAs)"}};
  if (ctx.cpu_int8_dot())
    variants.push_back({Precision::kInt8Weight, &ctx, "int8-weight (int8 dot products)"});
  for (const Variant& variant : variants) {
    BuildOptions options;
    options.precision = variant.precision;
    const std::unique_ptr<CompiledModel> narrow = compile_model_dir(*variant.context, dir, options);
    const Forward one_pass = run_forward(*narrow, prompt, decoder_ids, false);
    const double prefill_cos =
        cosine(one_pass.logits.data<float>() + last * v, ref.logits.data<float>() + last * v, v);
    std::cout << "  [" << GetParam().preset << " " << variant.name
              << ": last-token logits cosine vs fp32 " << prefill_cos << "]\n";
    EXPECT_GE(prefill_cos, 0.999) << variant.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Cpu, RealSize,
                         testing::Values(RealSizeCase{"bloom-560m"}, RealSizeCase{"flan-t5-base"}),
                         case_name);

}  // namespace
}  // namespace kiln::test
