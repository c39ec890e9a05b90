// The ONNX interpreter on the fixture exports (../shared/fixtures/onnx: a T5 encoder, a T5
// decoder without past and a BLOOM causal LM from torch.onnx.export, opset 17): every output
// within 1e-4 of onnxruntime 1.30's outputs in reference.safetensors, relative to the output's
// max |value|, at non-padded positions (attention_mask 1; the decoder's positions are all real).
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>

#include "frontend/onnx/fold_import_graph.h"
#include "frontend/onnx/import_graph.h"
#include "frontend/onnx/run_import_graph.h"
#include "io/onnx/onnx_model.h"
#include "io/safetensors.h"

namespace kiln {
namespace {

const std::string kOnnxDir = std::string(KILN_FIXTURES_DIR) + "/onnx";

struct Reference {
  std::map<std::string, ImportTensor> inputs;
  std::map<std::string, Tensor> outputs;
};

OnnxElemType elem_type(DType d) {
  if (d == DType::kI64) return OnnxElemType::kInt64;
  if (d == DType::kF32) return OnnxElemType::kFloat;
  ADD_FAILURE() << "reference.safetensors holds only I64 and F32 tensors, got " << dtype_name(d);
  return OnnxElemType::kUndefined;
}

Reference reference(const std::string& model) {
  const SafetensorsFile ref = SafetensorsFile::open(kOnnxDir + "/reference.safetensors");
  Reference r;
  for (const auto& [name, t] : ref.tensors()) {
    if (name.rfind(model + ".in.", 0) == 0)
      r.inputs[name.substr(model.size() + 4)] = ImportTensor::from_tensor(elem_type(t.dtype()), t);
    if (name.rfind(model + ".out.", 0) == 0) r.outputs[name.substr(model.size() + 5)] = t;
  }
  return r;
}

struct Error_ {
  double max_abs = 0, max_ref = 0;
  int64_t compared = 0;
};

// Max |got - ref| and max |ref| over the positions where `mask` ([batch, seq]) is 1, for an output
// whose first two dimensions are [batch, seq]; everywhere without a mask.
Error_ masked_error(const ImportTensor& got, const Tensor& ref, const ImportTensor* mask) {
  Error_ e;
  const std::vector<float> a = got.to_floats();
  const float* b = ref.data<float>();
  std::vector<int64_t> m;
  int64_t per_position = 1;
  if (mask != nullptr) {
    m = mask->to_int64s();
    EXPECT_EQ(got.dim(0), mask->dim(0));
    EXPECT_EQ(got.dim(1), mask->dim(1));
    per_position = got.numel() / mask->numel();
  }
  for (size_t i = 0; i < a.size(); ++i) {
    if (mask != nullptr && m[i / per_position] == 0) continue;
    ++e.compared;
    e.max_abs = std::max(e.max_abs, std::fabs(static_cast<double>(a[i]) - b[i]));
    e.max_ref = std::max(e.max_ref, std::fabs(static_cast<double>(b[i])));
  }
  return e;
}

class OnnxExecFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(OnnxExecFixture, MatchesOnnxruntimeAtRealPositions) {
  const std::string model = GetParam();
  const ImportGraph graph = ImportGraph::build(read_onnx_model(kOnnxDir + "/" + model + ".onnx"));
  const Reference ref = reference(model);
  ASSERT_FALSE(ref.inputs.empty());
  ASSERT_FALSE(ref.outputs.empty());
  ImportRunStats stats;
  const auto t0 = std::chrono::steady_clock::now();
  const std::map<std::string, ImportTensor> outputs = run_import_graph(graph, ref.inputs, &stats);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  // The decoder's mask is the encoder's (its keys); its own positions are all real.
  const auto mask_it = ref.inputs.find("attention_mask");
  const ImportTensor* mask = mask_it == ref.inputs.end() ? nullptr : &mask_it->second;
  EXPECT_EQ(outputs.size(), ref.outputs.size());
  for (const auto& [name, want] : ref.outputs) {
    const auto it = outputs.find(name);
    ASSERT_NE(it, outputs.end()) << model << ": no output " << name;
    ASSERT_EQ(it->second.type(), OnnxElemType::kFloat);
    ASSERT_EQ(it->second.shape(), want.shape()) << model << " " << name;
    const Error_ e = masked_error(it->second, want, mask);
    EXPECT_GT(e.compared, 0);
    EXPECT_GT(e.max_ref, 0);
    EXPECT_LE(e.max_abs, 1e-4 * e.max_ref) << model << " " << name;
    std::printf(
        "[ onnx     ] %s.%s: max abs error %.3g, max |ref| %.3g (relative %.3g) over %lld "
        "elements; %d nodes folded, %d run, %.1f ms\n",
        model.c_str(), name.c_str(), e.max_abs, e.max_ref, e.max_abs / e.max_ref,
        static_cast<long long>(e.compared), stats.folded_nodes, stats.executed_nodes, ms);
    RecordProperty(name + "_max_abs_error", std::to_string(e.max_abs));
  }
  // Shape subgraphs fold for the inputs' concrete shapes: every Shape node (at least) folds.
  int shape_nodes = 0;
  for (const ImportNode& n : graph.nodes()) shape_nodes += n.op_type == "Shape" ? 1 : 0;
  EXPECT_GT(shape_nodes, 0);
  std::map<std::string, Shape> shapes;
  for (const auto& [name, t] : ref.inputs) shapes[name] = t.shape();
  const FoldedGraph folded = fold_import_graph(graph, shapes);
  for (size_t n = 0; n < graph.nodes().size(); ++n)
    if (graph.nodes()[n].op_type == "Shape") {
      EXPECT_TRUE(folded.folded[n]) << graph.nodes()[n].name;
    }
  EXPECT_GT(folded.folded_nodes, fold_import_graph(graph).folded_nodes);
}

// Batch rows are independent: the second row alone gives the batch's second row (at its real
// positions), so the padding of one row does not leak into another.
TEST_P(OnnxExecFixture, RowsDoNotDependOnTheirBatch) {
  const std::string model = GetParam();
  const ImportGraph graph = ImportGraph::build(read_onnx_model(kOnnxDir + "/" + model + ".onnx"));
  const Reference ref = reference(model);
  const auto both = run_import_graph(graph, ref.inputs);
  std::map<std::string, ImportTensor> second;
  for (const auto& [name, t] : ref.inputs) {
    Shape s = t.shape();
    s[0] = 1;
    ImportTensor row = ImportTensor::zeros(t.type(), s);
    const size_t bytes = static_cast<size_t>(row.numel()) * row.element_bytes();
    std::memcpy(row.mutable_raw(), static_cast<const char*>(t.raw()) + bytes, bytes);
    second[name] = row;
  }
  const auto alone = run_import_graph(graph, second);
  const auto mask_it = second.find("attention_mask");
  for (const auto& [name, t] : both) {
    const ImportTensor& one = alone.at(name);
    const std::vector<float> a = t.to_floats(), b = one.to_floats();
    const size_t half = a.size() / 2;
    ASSERT_EQ(b.size(), half);
    std::vector<int64_t> m;
    int64_t per_position = 1;
    if (mask_it != second.end()) {
      m = mask_it->second.to_int64s();
      per_position = one.numel() / mask_it->second.numel();
    }
    double worst = 0, scale = 0;
    for (size_t i = 0; i < half; ++i) {
      if (!m.empty() && m[i / per_position] == 0) continue;
      worst = std::max(worst, std::fabs(static_cast<double>(a[half + i]) - b[i]));
      scale = std::max(scale, std::fabs(static_cast<double>(a[half + i])));
    }
    EXPECT_LE(worst, 1e-5 * scale) << model << " " << name;
  }
}

INSTANTIATE_TEST_SUITE_P(OnnxFixtures, OnnxExecFixture,
                         ::testing::Values("t5_encoder", "t5_decoder", "bloom"));

}  // namespace
}  // namespace kiln
