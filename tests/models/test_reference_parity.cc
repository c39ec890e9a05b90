// The reference backend runs both fixture models to HuggingFace's logits: the oracle the op
// tests trust is itself checked end to end (T5 buckets, gated gelu_new, RMSNorm, cross
// attention; BLOOM's ALiBi, packed QKV, LayerNorm), with the pass pipeline's fused graphs and
// without it.
#include <gtest/gtest.h>

#include "backend/reference/reference_backend.h"
#include "builder/builder.h"
#include "model_runner.h"
#include "parity_util.h"

namespace kiln::test {
namespace {

struct ReferenceCase {
  std::string dir;
  bool optimize;
};

class ReferenceBackendParity : public testing::TestWithParam<ReferenceCase> {};

TEST_P(ReferenceBackendParity, LogitsMatchHuggingFace) {
  Context ctx(ContextOptions{LogLevel::kWarning, 1});
  BuildOptions options;
  options.optimize = GetParam().optimize;
  const ModelIR model = build_model(fixture(GetParam().dir), options, ctx.log());
  std::unique_ptr<Backend> backend = make_reference_backend(ctx);
  std::unique_ptr<Executable> encoder;
  if (model.desc.encoder_decoder)
    encoder = backend->compile(model.graph(kEncoderGraph), model.profile);
  std::unique_ptr<Executable> decoder = backend->compile(model.graph(kDecoderGraph), model.profile);
  for (const std::string& name : decoder->kernel_names())
    ASSERT_EQ(name.rfind("reference", 0), 0u) << name;
  const ForwardModel m{model, *backend, encoder.get(), *decoder};

  const SafetensorsFile ref =
      SafetensorsFile::open(fixture(GetParam().dir + "/reference.safetensors"));
  int cases = 0;
  while (ref.tensors().count("case" + std::to_string(cases) + ".input_ids")) ++cases;
  ASSERT_GE(cases, 9);
  for (int c = 0; c < cases; ++c) {
    const std::string k = "case" + std::to_string(c);
    std::vector<int64_t> seq = ids_of(ref.tensors().at(k + ".greedy_ids"));
    seq.pop_back();  // logits are of greedy_ids[:-1]
    const std::vector<int64_t> prompt = ids_of(ref.tensors().at(k + ".input_ids"));
    // One token per step through the paged cache for one case: the decode path.
    for (bool step : c == 0 ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
      const Forward f = run_forward(m, prompt, seq, step);
      EXPECT_LE(relative_error(f.logits, ref.tensors().at(k + ".logits")), 1e-4)
          << k << (step ? " (one token per step)" : " (one pass)");
      if (model.desc.encoder_decoder) {
        EXPECT_LE(relative_error(f.encoder_hidden, ref.tensors().at(k + ".encoder_hidden")), 1e-4)
            << k;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ReferenceBackendParity,
                         testing::Values(ReferenceCase{"t5-tiny", true},
                                         ReferenceCase{"t5-tiny", false},
                                         ReferenceCase{"bloom-tiny", true},
                                         ReferenceCase{"bloom-tiny", false}),
                         [](const auto& info) {
                           return std::string(info.param.dir[0] == 't' ? "T5" : "Bloom") +
                                  (info.param.optimize ? "Optimized" : "Unoptimized");
                         });

}  // namespace
}  // namespace kiln::test
