// Exports that do not lift into a generation plan, and bad --onnx / --tokenizer arguments: each
// a clear error naming the step and the pattern that failed where, never a crash (these suites
// run under AddressSanitizer). The broken exports are the fixture BLOOM export with one constant
// changed through the protobuf API: what the test changed is what the error must name.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>

#include "builder/builder.h"
#include "frontend/onnx/onnx_frontend.h"
#include "graph/position_bias.h"
#include "onnx_test_models.h"

namespace kiln {
namespace {

using onnx_test::expect_error;
using onnx_test::test_dir;

const std::string kOnnxDir = std::string(KILN_FIXTURES_DIR) + "/onnx";
const std::string kBloomTokenizer = std::string(KILN_FIXTURES_DIR) + "/bloom-tiny/tokenizer.json";
const std::string kT5Tokenizer = std::string(KILN_FIXTURES_DIR) + "/t5-tiny/spiece.model";

::onnx::ModelProto load(const std::string& file) {
  std::ifstream in(kOnnxDir + "/" + file, std::ios::binary);
  std::stringstream s;
  s << in.rdbuf();
  ::onnx::ModelProto m;
  EXPECT_TRUE(m.ParseFromString(s.str()));
  return m;
}

// The float values of a Constant node's value attribute (empty for other nodes).
std::vector<float> constant_floats(const ::onnx::NodeProto& n) {
  if (n.op_type() != "Constant" || n.attribute_size() != 1) return {};
  const ::onnx::TensorProto& t = n.attribute(0).t();
  if (t.data_type() != ::onnx::TensorProto::FLOAT || t.raw_data().empty()) return {};
  std::vector<float> v(t.raw_data().size() / sizeof(float));
  std::memcpy(v.data(), t.raw_data().data(), t.raw_data().size());
  return v;
}

void set_constant_floats(::onnx::NodeProto* n, const std::vector<float>& v) {
  n->mutable_attribute(0)->mutable_t()->set_raw_data(
      std::string(reinterpret_cast<const char*>(v.data()), v.size() * sizeof(float)));
}

// Changes every Constant node whose values `match`, returning how many.
int change_constants(::onnx::ModelProto& m,
                     const std::function<bool(const std::vector<float>&)>& match,
                     const std::function<void(std::vector<float>&)>& change) {
  int changed = 0;
  for (auto& n : *m.mutable_graph()->mutable_node()) {
    std::vector<float> v = constant_floats(n);
    if (v.empty() || !match(v)) continue;
    change(v);
    set_constant_floats(&n, v);
    ++changed;
  }
  return changed;
}

void build(const std::vector<std::string>& files, const std::string& tokenizer) {
  const Logger quiet(LogLevel::kSilent);
  build_model_from_onnx(files, tokenizer, BuildOptions{}, quiet);
}

TEST(OnnxLiftBadInput, AlibiSlopesNotBloomsNameTheAttention) {
  ::onnx::ModelProto m = load("bloom.onnx");
  const int changed = change_constants(
      m,
      [](const std::vector<float>& v) {
        return v.size() > 1 && v == alibi_slopes(static_cast<int>(v.size()));
      },
      [](std::vector<float>& v) { v[0] *= 2; });
  ASSERT_EQ(changed, 1) << "the export holds BLOOM's slopes as one Constant";
  const std::string path = onnx_test::write_model(m, test_dir() + "/bloom.onnx");
  expect_error([&] { build({path}, kBloomTokenizer); },
               {"does not lift into a BLOOM causal LM", "layer 0",
                "attention at node '/m/transformer/h.0/self_attention/Softmax'", "not ALiBi's"});
}

TEST(OnnxLiftBadInput, ScoresScaledWronglyNameTheLayer) {
  ::onnx::ModelProto m = load("bloom.onnx");
  // The fixture's heads are 8 wide: its scores are scaled by 1/sqrt(8).
  const float scale = static_cast<float>(1.0 / std::sqrt(8.0));
  const int changed = change_constants(
      m, [&](const std::vector<float>& v) { return v.size() == 1 && v[0] == scale; },
      [](std::vector<float>& v) { v[0] = 0.5f; });
  ASSERT_GE(changed, 1);
  const std::string path = onnx_test::write_model(m, test_dir() + "/bloom.onnx");
  expect_error([&] { build({path}, kBloomTokenizer); },
               {"layer 0", "scores are scaled by 0.5, not 1/sqrt(head_dim)"});
}

TEST(OnnxLiftBadInput, GeluConstantChangedSaysWhichPatternFailed) {
  ::onnx::ModelProto m = load("bloom.onnx");
  const int changed = change_constants(
      m, [](const std::vector<float>& v) { return v.size() == 1 && v[0] == 0.044715f; },
      [](std::vector<float>& v) { v[0] = 0.06f; });
  ASSERT_GE(changed, 1);
  const std::string path = onnx_test::write_model(m, test_dir() + "/bloom.onnx");
  expect_error([&] { build({path}, kBloomTokenizer); },
               {"layer 0 gelu", "gelu at node", "computes neither tanh GELU"});
}

TEST(OnnxLiftBadInput, SoftmaxOverAnotherAxis) {
  ::onnx::ModelProto m = load("bloom.onnx");
  int changed = 0;
  for (auto& n : *m.mutable_graph()->mutable_node())
    if (n.op_type() == "Softmax") {
      for (auto& a : *n.mutable_attribute())
        if (a.name() == "axis") a.set_i(1);
      ++changed;
    }
  ASSERT_GE(changed, 1);
  const std::string path = onnx_test::write_model(m, test_dir() + "/bloom.onnx");
  expect_error([&] { build({path}, kBloomTokenizer); },
               {"attention at node", "softmax is not over the last axis"});
}

TEST(OnnxLiftBadInput, GraphWithoutAModel) {
  // MatMul + Add lifts to a Linear, but there is no embedding of input_ids.
  const std::string path = onnx_test::write_model(onnx_test::tiny_model(), test_dir() + "/t.onnx");
  expect_error([&] { build({path}, kBloomTokenizer); },
               {"does not lift into a BLOOM causal LM", "no graph input named 'input_ids'"});
}

TEST(OnnxLiftBadInput, NodeWithoutItsInputs) {
  ::onnx::ModelProto m = onnx_test::tiny_model();
  for (auto& n : *m.mutable_graph()->mutable_node())
    if (n.name() == "bias") n.mutable_input()->RemoveLast();
  const std::string path = onnx_test::write_model(m, test_dir() + "/t.onnx");
  expect_error([&] { build({path}, kBloomTokenizer); }, {"node 'bias' (Add)"});
}

// Half of a T5 given alone is named as such, with the command that builds it.
TEST(OnnxLiftBadInput, T5HalfAloneIsNamed) {
  expect_error([&] { build({kOnnxDir + "/t5_encoder.onnx"}, kT5Tokenizer); },
               {"this is a T5 encoder export", "--onnx ENCODER.onnx --onnx DECODER.onnx"},
               ErrorKind::kUsage);
  expect_error([&] { build({kOnnxDir + "/t5_decoder.onnx"}, kT5Tokenizer); },
               {"this is a T5 decoder export"}, ErrorKind::kUsage);
}

TEST(OnnxLiftBadInput, TwoEncodersHaveNoDecoder) {
  const std::string enc = kOnnxDir + "/t5_encoder.onnx";
  expect_error([&] { build({enc, enc}, kT5Tokenizer); }, {"neither reads 'encoder_hidden_states'"});
}

TEST(OnnxLiftBadInput, DecoderBeforeEncoderIsFine) {
  const Logger quiet(LogLevel::kSilent);
  const ModelIR model =
      build_model_from_onnx({kOnnxDir + "/t5_decoder.onnx", kOnnxDir + "/t5_encoder.onnx"},
                            kT5Tokenizer, BuildOptions{}, quiet);
  EXPECT_TRUE(model.desc.encoder_decoder);
}

TEST(OnnxLiftBadInput, TokenizerMissingOrUnknown) {
  const std::string bloom = kOnnxDir + "/bloom.onnx";
  expect_error([&] { build({bloom}, ""); }, {"--tokenizer tokenizer.json"}, ErrorKind::kUsage);
  expect_error([&] { build({bloom}, kOnnxDir + "/reference.json.txt"); },
               {"expected tokenizer.json"}, ErrorKind::kUsage);
}

TEST(OnnxLiftBadInput, OnnxArguments) {
  expect_error([] { resolve_onnx_sources({}); }, {"give one file"}, ErrorKind::kUsage);
  expect_error([] { resolve_onnx_sources({"a", "b", "c"}); }, {"3 arguments"}, ErrorKind::kUsage);
  expect_error([] { resolve_onnx_sources({"/nonexistent/x.onnx"}); }, {"no such file"},
               ErrorKind::kUsage);
  const std::string dir = test_dir();
  expect_error([&] { resolve_onnx_sources({dir}); }, {"encoder_model.onnx"}, ErrorKind::kUsage);
}

TEST(OnnxLiftBadInput, OptimumFolder) {
  namespace fs = std::filesystem;
  const fs::path dir = test_dir();
  fs::create_symlink(kOnnxDir + "/t5_encoder.onnx", dir / "encoder_model.onnx");
  fs::create_symlink(kOnnxDir + "/t5_decoder.onnx", dir / "decoder_model.onnx");
  EXPECT_EQ(resolve_onnx_sources({dir.string()}),
            (std::vector<std::string>{(dir / "encoder_model.onnx").string(),
                                      (dir / "decoder_model.onnx").string()}));
  const fs::path causal = dir / "causal";
  fs::create_directories(causal);
  fs::create_symlink(kOnnxDir + "/bloom.onnx", causal / "decoder_model.onnx");
  EXPECT_EQ(resolve_onnx_sources({causal.string()}),
            (std::vector<std::string>{(causal / "decoder_model.onnx").string()}));
  const Logger quiet(LogLevel::kSilent);
  EXPECT_TRUE(build_model_from_onnx(resolve_onnx_sources({dir.string()}), kT5Tokenizer,
                                    BuildOptions{}, quiet)
                  .desc.encoder_decoder);
}

}  // namespace
}  // namespace kiln
