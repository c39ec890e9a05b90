// Bad input to the ONNX interpreter (`make asan` runs these: the suite names contain BadInput):
// inputs that do not match the graph's declarations, and graphs whose nodes fail at run time or
// while folding. Each gives a kiln::Error naming what is wrong, never a crash.
#include "onnx_op_harness.h"
#include "onnx_test_models.h"

namespace kiln {
namespace {

using namespace onnx_test;
const std::string kOnnxDir = std::string(KILN_FIXTURES_DIR) + "/onnx";

ImportGraph bloom() { return ImportGraph::build(read_onnx_model(kOnnxDir + "/bloom.onnx")); }

std::map<std::string, ImportTensor> bloom_inputs(Shape ids, Shape mask) {
  return {{"input_ids", ImportTensor::zeros(OnnxElemType::kInt64, std::move(ids))},
          {"attention_mask", ImportTensor::zeros(OnnxElemType::kInt64, std::move(mask))}};
}

TEST(OnnxExecBadInput, InputNamesMustBeTheGraphs) {
  const ImportGraph g = bloom();
  auto inputs = bloom_inputs({1, 4}, {1, 4});
  inputs["input_idz"] = inputs["input_ids"];
  expect_error([&] { run_import_graph(g, inputs); },
               {"bloom.onnx", "'input_idz' is not an input of the graph", "'input_ids' (int64["},
               ErrorKind::kUsage);
  inputs = bloom_inputs({1, 4}, {1, 4});
  inputs.erase("attention_mask");
  expect_error([&] { run_import_graph(g, inputs); },
               {"input 'attention_mask' (int64[", "is missing"}, ErrorKind::kUsage);
}

TEST(OnnxExecBadInput, InputTypesAndRanksMustMatch) {
  const ImportGraph g = bloom();
  auto inputs = bloom_inputs({1, 4}, {1, 4});
  inputs["input_ids"] = ImportTensor::zeros(OnnxElemType::kFloat, {1, 4});
  expect_error([&] { run_import_graph(g, inputs); },
               {"input 'input_ids' is float[1, 4], expected int64["}, ErrorKind::kUsage);
  inputs = bloom_inputs({4}, {4});
  expect_error([&] { run_import_graph(g, inputs); },
               {"input 'input_ids' is int64[4] (rank 1), expected int64[batch, seq] (rank 2)"},
               ErrorKind::kUsage);
}

TEST(OnnxExecBadInput, SymbolicDimensionsMustAgreeAcrossInputs) {
  const ImportGraph g = bloom();
  // bloom.onnx names its dynamic axes: input_ids and attention_mask share batch_size.
  expect_error(
      [&] {
        run_import_graph(g, bloom_inputs({2, 4}, {3, 4}));
      },
      {"input '", "' is int64[", "dimension 0", "but input '"}, ErrorKind::kUsage);
}

TEST(OnnxExecBadInput, StaticDimensionsMustMatch) {
  OpCase c{"Relu", {f32({2, 3}, {1, 2, 3, 4, 5, 6})}};
  const ImportGraph g = ImportGraph::build(op_model(c, Feed::kRunTime));
  expect_error(
      [&] {
        run_import_graph(g, {{"x0", f32({2, 4}, std::vector<float>(8, 0))}});
      },
      {"input 'x0' is float[2, 4], expected float[2, 3]: dimension 1 must be 3"},
      ErrorKind::kUsage);
}

TEST(OnnxExecBadInput, MatMulShapeMismatchAtRunTime) {
  expect_op_error(
      {"MatMul", {f32({2, 3}, std::vector<float>(6, 1)), f32({2, 3}, std::vector<float>(6, 1))}},
      {"op_test.onnx: node 'MatMul_node' (MatMul)", "inner dimensions differ (3 vs 2)"});
  expect_op_error(
      {"MatMul",
       {f32({2, 2, 3}, std::vector<float>(12, 1)), f32({3, 3, 1}, std::vector<float>(9, 1))}},
      {"do not broadcast"});
}

TEST(OnnxExecBadInput, ReshapeToAnImpossibleShape) {
  const ImportTensor x = f32({2, 3}, std::vector<float>(6, 1));
  expect_op_error(
      {"Reshape", {x, i64({2}, {4, -1})}},
      {"node 'Reshape_node' (Reshape)", "cannot reshape [2, 3] (6 elements) to [4, -1]"});
  expect_op_error({"Reshape", {x, i64({2}, {-1, -1})}}, {"more than one -1"});
  expect_op_error({"Reshape", {x, i64({2}, {5, 2})}},
                  {"cannot reshape [2, 3] (6 elements) to [5, 2]"});
  expect_op_error({"Reshape", {x, i64({2}, {-2, 3})}}, {"negative dimension"});
  const int64_t huge = int64_t{1} << 40;
  expect_op_error({"Reshape", {x, i64({3}, {huge, huge, huge})}}, {"too many elements"});
}

TEST(OnnxExecBadInput, IndexAndValueErrors) {
  const ImportTensor data = f32({3, 2}, std::vector<float>(6, 1));
  expect_op_error({"Gather", {data, i64({1}, {3})}}, {"Gather index 3 is out of range"});
  expect_op_error({"Gather", {data, i64({1}, {-4})}}, {"Gather index -4 is out of range"});
  expect_op_error({"Gather", {data, f32({1}, {0})}}, {"indices must be int64 or int32"});
  expect_op_error({"GatherND", {data, i64({1, 2}, {0, 2})}}, {"GatherND index 2 is out of range"});
  expect_op_error({"Div", {i64({2}, {1, 2}), i64({2}, {1, 0})}}, {"integer division by zero"});
  expect_op_error({"Range", {i64({}, {0}), i64({}, {5}), i64({}, {0})}}, {"Range's delta is 0"});
  expect_op_error({"Range", {f32({}, {0}), f32({}, {1e30f}), f32({}, {1e-30f})}},
                  {"too many elements"});
  expect_op_error({"Slice", {data, i64({1}, {0}), i64({1}, {1}), i64({1}, {0}), i64({1}, {0})}},
                  {"Slice step for axis 0 is 0"});
  expect_op_error({"Squeeze", {data, i64({1}, {0})}}, {"cannot squeeze dimension 0 of [3, 2]"});
  expect_op_error({"Unsqueeze", {data, i64({2}, {0, 0})}}, {"name dimension 0 twice"});
  expect_op_error({"Transpose", {data}, {attr_ints("perm", {0, 0})}}, {"not a permutation"});
  expect_op_error({"Concat", {data, f32({2, 3}, std::vector<float>(6, 1))}, {attr_int("axis", 0)}},
                  {"Concat along axis 0: input 1 has shape [2, 3]"});
  expect_op_error({"Split", {data, i64({2}, {1, 1})}, {}, 2}, {"must sum to dimension 0 (3)"});
  expect_op_error({"Softmax", {data}, {attr_int("axis", 2)}},
                  {"Softmax axis 2 is out of range for rank 2"});
  expect_op_error({"Add", {data, f32({4}, std::vector<float>(4, 1))}},
                  {"shapes [3, 2], [4] do not broadcast"});
  expect_op_error({"Add", {data, i64({2}, {1, 1})}},
                  {"Add needs operands of one type, got float and int64"});
  expect_op_error({"Sqrt", {i64({1}, {4})}}, {"Sqrt does not take int64 tensors"});
  expect_op_error({"Cast", {data}, {attr_int("to", 8)}}, {"Cast's target type is string"});
  expect_op_error({"Cast", {data}}, {"Cast needs the attribute 'to'"});
  expect_op_error({"Gemm", {data, data}}, {"inner dimensions differ"});
  expect_op_error({"Trilu", {f32({3}, {1, 2, 3})}}, {"Trilu needs a tensor of rank 2 or more"});
  expect_op_error({"CumSum", {data, i64({}, {2})}}, {"CumSum axis 2 is out of range"});
  expect_op_error({"Where", {f32({1}, {1}), data, data}}, {"Where's condition must be bool"});
  expect_op_error({"LayerNormalization", {data, f32({3}, {1, 1, 1})}},
                  {"Scale [3] does not broadcast to the normalized shape [2]"});
  expect_op_error({"Expand", {data, i64({2}, {4, 2})}}, {"do not broadcast"});
}

// A tensor too large for this machine's memory is refused before anything is allocated.
TEST(OnnxExecBadInput, HugeTensorsAreRefused) {
  const int64_t big = int64_t{1} << 20;
  expect_op_error({"ConstantOfShape", {i64({3}, {big, big, 64})}}, {"would take more than 64 GiB"});
  expect_op_error({"Expand", {f32({1}, {1}), i64({2}, {big, big})}},
                  {"would take more than 64 GiB"});
  expect_op_error({"ConstantOfShape", {i64({1}, {-1})}}, {"negative dimension"});
}

TEST(OnnxExecBadInput, OpsWithoutAKernelAreListedBeforeAnythingRuns) {
  OpCase c{"NonMaxSuppression", {f32({1}, {1})}};
  const ImportGraph g = ImportGraph::build(op_model(c, Feed::kRunTime));
  expect_error(
      [&] {
        run_import_graph(g, {{"x0", f32({1}, {1})}});
      },
      {"op_test.onnx", "ops kiln does not import", "NonMaxSuppression"});
}

TEST(OnnxExecBadInput, InitializersOfTypesWithoutKernelsAreNamed) {
  // A double initializer feeding Add: the node that reads it fails, naming it.
  OnnxModel m = op_model({"Add", {f32({1}, {1}), f32({1}, {2})}}, Feed::kRunTime);
  m.graph.inputs.pop_back();
  OnnxTensor d;
  d.name = "x1";
  d.type = OnnxElemType::kDouble;
  d.dims = {1};
  d.bytes = 8;
  m.graph.initializers.push_back(d);
  const ImportGraph g = ImportGraph::build(m);
  expect_error(
      [&] {
        run_import_graph(g, {{"x0", f32({1}, {1})}});
      },
      {"node 'Add_node' (Add) cannot run", "initializer 'x1' is double"});
}

}  // namespace
}  // namespace kiln
