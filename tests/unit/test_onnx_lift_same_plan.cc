// A lifted export is the model its HF checkpoint would be: the config and weights lifting reads
// from an export, written out as an HF checkpoint directory and built with `--model`'s path,
// give the same optimized graphs (node for node, attributes, weight bytes and layouts) and the
// same weights digest as the build from the ONNX files — so a plan from ONNX gets every fusion,
// precision and kernel, and runs as fast as one from the checkpoint.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "frontend/onnx/onnx_frontend.h"
#include "onnx_lift_util.h"
#include "onnx_test_models.h"

namespace kiln {
namespace {

using namespace lift_test;  // NOLINT: the helpers of this test family
namespace fs = std::filesystem;

// The lifted config and weights as an HF checkpoint directory with `tokenizer`.
std::string write_checkpoint(const LiftedModel& m, const std::string& tokenizer,
                             const std::string& dir) {
  std::ofstream(dir + "/config.json") << model_config_to_json(m.config);
  write_safetensors(dir + "/model.safetensors", m.tensors);
  fs::copy_file(tokenizer, fs::path(dir) / fs::path(tokenizer).filename());
  return dir;
}

void expect_same_model(const ModelIR& a, const ModelIR& b) {
  EXPECT_EQ(a.weights_digest, b.weights_digest);
  EXPECT_EQ(a.tokenizer_bytes, b.tokenizer_bytes);
  ASSERT_EQ(a.graphs.size(), b.graphs.size());
  for (size_t gi = 0; gi < a.graphs.size(); ++gi) {
    const Graph& x = a.graphs[gi];
    const Graph& y = b.graphs[gi];
    EXPECT_EQ(x.name, y.name);
    ASSERT_EQ(x.nodes.size(), y.nodes.size()) << x.name;
    for (size_t n = 0; n < x.nodes.size(); ++n) {
      EXPECT_EQ(x.nodes[n].op, y.nodes[n].op) << x.nodes[n].name;
      EXPECT_EQ(x.nodes[n].name, y.nodes[n].name);
      EXPECT_EQ(x.nodes[n].inputs, y.nodes[n].inputs) << x.nodes[n].name;
      EXPECT_TRUE(x.nodes[n].attrs == y.nodes[n].attrs) << x.nodes[n].name;
    }
    ASSERT_EQ(x.values.size(), y.values.size()) << x.name;
    int weights = 0;
    for (size_t v = 0; v < x.values.size(); ++v) {
      const Value& p = x.values[v];
      const Value& q = y.values[v];
      EXPECT_EQ(p.name, q.name);
      EXPECT_EQ(p.dtype, q.dtype) << p.name;
      EXPECT_TRUE(p.layout == q.layout) << p.name;
      if (!p.data.defined()) continue;
      ++weights;
      ASSERT_EQ(p.data.nbytes(), q.data.nbytes()) << p.name;
      EXPECT_EQ(std::memcmp(p.data.raw(), q.data.raw(), p.data.nbytes()), 0) << p.name;
    }
    EXPECT_GT(weights, 0) << x.name;
  }
}

TEST(OnnxLiftSamePlan, BloomExportIsItsCheckpoint) {
  const Logger quiet(LogLevel::kSilent);
  const std::string onnx = kOnnxDir + "/bloom.onnx";
  const LiftedFile f = lift_onnx_file(onnx, quiet);
  const LiftedModel m = assemble_bloom(*f.pattern, f.lifted, quiet);
  const std::string dir = write_checkpoint(m, kBloomTokenizer, onnx_test::test_dir());
  BuildOptions options;
  options.pack_for_cpu = CpuIsa::kAvx512;  // the packed layouts too
  expect_same_model(build_model_from_onnx({onnx}, kBloomTokenizer, options, quiet),
                    build_model(dir, options, quiet));
}

TEST(OnnxLiftSamePlan, T5ExportIsItsCheckpoint) {
  const Logger quiet(LogLevel::kSilent);
  const std::string enc = kOnnxDir + "/t5_encoder.onnx", dec = kOnnxDir + "/t5_decoder.onnx";
  const LiftedFile e = lift_onnx_file(enc, quiet), d = lift_onnx_file(dec, quiet);
  const LiftedModel m = assemble_t5(*e.pattern, e.lifted, *d.pattern, d.lifted, quiet);
  const std::string dir = write_checkpoint(m, kT5Tokenizer, onnx_test::test_dir());
  BuildOptions options;
  options.pack_for_cpu = CpuIsa::kAvx512;
  expect_same_model(build_model_from_onnx({enc, dec}, kT5Tokenizer, options, quiet),
                    build_model(dir, options, quiet));
}

}  // namespace
}  // namespace kiln
