// Exports made on the GPU machine by scripts/device/make_onnx_exports.py (tests/data/onnx-exports,
// README there): a tiny random BLOOM exported in fp16 by the TorchScript exporter, with its
// dynamic axes given as lists (each input's axes named apart), and in fp32 by the dynamo
// exporter (opset 18). Both lift into generation plans whose logits match onnxruntime's (on the
// fp16 export, within fp16's rounding). Two exports that do not lift are refused saying why: a
// dynamo T5 encoder exported from a module in train() (training-mode Dropouts) and an fp16 T5
// encoder whose fp16 clamp uses IsInf, ReduceSum and Clip.
#include <gtest/gtest.h>

#include "onnx_lift_util.h"
#include "onnx_test_models.h"

namespace kiln {
namespace {

using namespace lift_test;  // NOLINT: the helpers of this test family

const std::string kExports = std::string(KILN_SOURCE_DIR) + "/tests/data/onnx-exports";

const SafetensorsFile& exports_reference() {
  static const SafetensorsFile ref = SafetensorsFile::open(kExports + "/reference.safetensors");
  return ref;
}

// The plan of `file` against onnxruntime's logits for its inputs (NAME.in.*, NAME.out.logits),
// at the real positions; returns max |error| / max |ref|.
double bloom_export_error(Context& ctx, const std::string& name) {
  CompiledModel engine(ctx, build_model_from_onnx({kExports + "/" + name + ".onnx"},
                                                  kBloomTokenizer, BuildOptions{}, ctx.log()));
  const auto& t = exports_reference().tensors();
  const Tensor& ids = t.at(name + ".in.input_ids");
  const Tensor& mask = t.at(name + ".in.attention_mask");
  const std::vector<float> ort = floats(t.at(name + ".out.logits"));
  const int64_t s = ids.dim(1), vocab = engine.desc().vocab_size;
  EXPECT_EQ(static_cast<int64_t>(ort.size()), ids.dim(0) * s * vocab);
  Error_ e;
  for (int64_t r = 0; r < ids.dim(0); ++r)
    accumulate(e, ort, s, vocab, r, positions_of(mask, r),
               run_forward(engine, {}, real_tokens(ids, mask, r), false).logits);
  EXPECT_GT(e.max_ref, 0.0) << name;
  std::printf("[ export   ] %s: max abs error %.3g, max |ref| %.3g\n", name.c_str(), e.max_abs,
              e.max_ref);
  return e.max_abs / e.max_ref;
}

class OnnxExports : public ::testing::Test {
 protected:
  Context ctx_{ContextOptions{LogLevel::kWarning, 2}};
};

// onnxruntime computes the fp16 export in fp16 (2^-11 relative a rounding): 1e-3 of max |ref|.
TEST_F(OnnxExports, BloomFp16TorchScriptExportMatchesOnnxruntime) {
  EXPECT_LE(bloom_export_error(ctx_, "bloom_fp16"), 1e-3);
}

TEST_F(OnnxExports, BloomDynamoExportMatchesOnnxruntime) {
  EXPECT_LE(bloom_export_error(ctx_, "bloom_dynamo"), 1e-4);
}

// Refusals (a BadInput suite: `make asan` runs it).
using OnnxExportsBadInput = OnnxExports;

TEST_F(OnnxExportsBadInput, ATrainingModeExportIsRefusedSayingWhy) {
  onnx_test::expect_error(
      [&] {
        build_model_from_onnx({kExports + "/t5_encoder_dynamo_train.onnx"}, kT5Tokenizer,
                              BuildOptions{}, ctx_.log());
      },
      {"Dropout (8 nodes)", "training mode", "model.eval()"});
}

TEST_F(OnnxExportsBadInput, TheFp16T5ClampOpsAreNamed) {
  onnx_test::expect_error(
      [&] {
        build_model_from_onnx({kExports + "/t5_encoder_fp16.onnx"}, kT5Tokenizer, BuildOptions{},
                              ctx_.log());
      },
      {"IsInf (4 nodes)", "ReduceSum (4 nodes)", "Clip (4 nodes)"});
}

}  // namespace
}  // namespace kiln
