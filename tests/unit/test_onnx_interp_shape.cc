// The ONNX interpreter's shape, layout, indexing and constant kernels, one op at a time
// (onnx_op_harness.h: run-time inputs and folded, which must agree). Expected values are worked
// out by hand from ONNX's operator specification.
#include "onnx_op_harness.h"

namespace kiln {
namespace {

using namespace onnx_test;
constexpr OnnxElemType kF = OnnxElemType::kFloat;
constexpr OnnxElemType kI = OnnxElemType::kInt64;

std::vector<double> iota(int n, double from = 0) {
  std::vector<double> v(n);
  for (int i = 0; i < n; ++i) v[i] = from + i;
  return v;
}
std::vector<float> iota_f(int n, float from = 0) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = from + static_cast<float>(i);
  return v;
}

TEST(OnnxInterpReshape, ZeroCopiesAndMinusOneInfers) {
  const ImportTensor x = f32({2, 3}, {1, 2, 3, 4, 5, 6});
  expect_tensor(run_op1({"Reshape", {x, i64({2}, {3, -1})}}), kF, {3, 2}, iota(6, 1));
  expect_tensor(run_op1({"Reshape", {x, i64({2}, {0, -1})}}), kF, {2, 3}, iota(6, 1));
  expect_tensor(run_op1({"Reshape", {x, i64({1}, {-1})}}), kF, {6}, iota(6, 1));
  // 0 copies the input's dimension 1 (3), -1 takes the rest: [1, 3, 2].
  expect_tensor(run_op1({"Reshape", {x, i64({3}, {1, 0, -1})}}), kF, {1, 3, 2}, iota(6, 1));
}

TEST(OnnxInterpReshape, AllowZeroSinceOpset14) {
  // An empty [0, 3]: shape [3, 0] with allowzero is a real 0 ...
  const ImportTensor empty = f32({0, 3}, {});
  expect_tensor(run_op1({"Reshape", {empty, i64({2}, {3, 0})}, {attr_int("allowzero", 1)}, 1, 14}),
                kF, {3, 0}, {});
  // ... without it 0 copies the input's dimension 1 (3): [3, 3] has 9 elements, not 0.
  expect_op_error({"Reshape", {empty, i64({2}, {3, 0})}, {}, 1, 14}, {"cannot reshape"});
  // Opset 13 has no allowzero: the attribute does not apply.
  expect_op_error({"Reshape", {empty, i64({2}, {3, 0})}, {attr_int("allowzero", 1)}, 1, 13},
                  {"cannot reshape"});
}

TEST(OnnxInterpReshape, FlattenSqueezeUnsqueeze) {
  const ImportTensor x = f32({2, 3, 4}, iota_f(24));
  expect_tensor(run_op1({"Flatten", {x}, {attr_int("axis", 2)}}), kF, {6, 4}, iota(24));
  expect_tensor(run_op1({"Flatten", {x}, {attr_int("axis", 0)}}), kF, {1, 24}, iota(24));
  expect_tensor(run_op1({"Flatten", {x}, {attr_int("axis", -1)}}), kF, {6, 4}, iota(24));
  expect_tensor(run_op1({"Flatten", {x}, {attr_int("axis", 3)}}), kF, {24, 1}, iota(24));
  expect_tensor(run_op1({"Flatten", {x}}), kF, {2, 12}, iota(24));

  const ImportTensor y = i64({1, 3, 1}, {7, 8, 9});
  expect_tensor(run_op1({"Squeeze", {y, i64({1}, {-1})}}), kI, {1, 3}, {7, 8, 9});
  expect_tensor(run_op1({"Squeeze", {y}}), kI, {3}, {7, 8, 9});
  expect_tensor(run_op1({"Squeeze", {y, i64({2}, {0, 2})}}), kI, {3}, {7, 8, 9});

  expect_tensor(run_op1({"Unsqueeze", {i64({3}, {7, 8, 9}), i64({2}, {0, -1})}}), kI, {1, 3, 1},
                {7, 8, 9});
  expect_tensor(run_op1({"Unsqueeze", {f32({2, 3}, iota_f(6)), i64({1}, {1})}}), kF, {2, 1, 3},
                iota(6));
  // Axes refer to the output: [2, 3] with axes [3, 0] -> [1, 2, 3, 1].
  expect_tensor(run_op1({"Unsqueeze", {f32({2, 3}, iota_f(6)), i64({2}, {3, 0})}}), kF,
                {1, 2, 3, 1}, iota(6));
  expect_tensor(run_op1({"Unsqueeze", {i64({}, {5}), i64({1}, {0})}}), kI, {1}, {5});
}

TEST(OnnxInterpReshape, ExpandBroadcastsBothWays) {
  // [3, 1] to [2, 1, 4]: -> [2, 3, 4], each row repeated.
  const ImportTensor x = f32({3, 1}, {1, 2, 3});
  std::vector<double> want;
  for (int b = 0; b < 2; ++b)
    for (double v : {1.0, 2.0, 3.0})
      for (int k = 0; k < 4; ++k) want.push_back(v);
  expect_tensor(run_op1({"Expand", {x, i64({3}, {2, 1, 4})}}), kF, {2, 3, 4}, want);
  // A shape of lower rank with 1s keeps the input's dimensions.
  expect_tensor(run_op1({"Expand", {x, i64({1}, {1})}}), kF, {3, 1}, {1, 2, 3});
  expect_tensor(run_op1({"Expand", {i64({}, {7}), i64({2}, {2, 2})}}), kI, {2, 2}, {7, 7, 7, 7});
}

TEST(OnnxInterpLayout, Transpose) {
  expect_tensor(run_op1({"Transpose", {f32({2, 3}, {1, 2, 3, 4, 5, 6})}}), kF, {3, 2},
                {1, 4, 2, 5, 3, 6});
  expect_tensor(
      run_op1({"Transpose", {f32({1, 2, 3}, {1, 2, 3, 4, 5, 6})}, {attr_ints("perm", {0, 2, 1})}}),
      kF, {1, 3, 2}, {1, 4, 2, 5, 3, 6});
  // [2, 1, 2] with perm [2, 0, 1]: out[k][i][j] = in[i][j][k].
  expect_tensor(
      run_op1({"Transpose", {i64({2, 1, 2}, {1, 2, 3, 4})}, {attr_ints("perm", {2, 0, 1})}}), kI,
      {2, 2, 1}, {1, 3, 2, 4});
}

TEST(OnnxInterpLayout, Concat) {
  expect_tensor(
      run_op1({"Concat", {f32({2, 1}, {1, 2}), f32({2, 2}, {3, 4, 5, 6})}, {attr_int("axis", -1)}}),
      kF, {2, 3}, {1, 3, 4, 2, 5, 6});
  expect_tensor(run_op1({"Concat",
                         {i64({0, 2}, {}), i64({1, 2}, {1, 2}), i64({1, 2}, {3, 4})},
                         {attr_int("axis", 0)}}),
                kI, {2, 2}, {1, 2, 3, 4});
  // Shape arithmetic as exporters write it: 1-d int64 pieces.
  expect_tensor(run_op1({"Concat", {i64({1}, {2}), i64({2}, {-1, 64})}, {attr_int("axis", 0)}}), kI,
                {3}, {2, -1, 64});
}

TEST(OnnxInterpLayout, SplitSizesInputEqualPartsAndNumOutputs) {
  const ImportTensor x = f32({6}, {1, 2, 3, 4, 5, 6});
  std::vector<ImportTensor> out = run_op({"Split", {x, i64({2}, {2, 4})}, {}, 2, 13});
  expect_tensor(out[0], kF, {2}, {1, 2});
  expect_tensor(out[1], kF, {4}, {3, 4, 5, 6});
  out = run_op({"Split", {x}, {}, 3, 13});
  expect_tensor(out[0], kF, {2}, {1, 2});
  expect_tensor(out[2], kF, {2}, {5, 6});
  // Opset 18: num_outputs, the last part smaller (ceil(5 / 3) = 2: 2, 2, 1).
  out = run_op({"Split", {f32({5}, {1, 2, 3, 4, 5})}, {attr_int("num_outputs", 3)}, 3, 18});
  expect_tensor(out[0], kF, {2}, {1, 2});
  expect_tensor(out[1], kF, {2}, {3, 4});
  expect_tensor(out[2], kF, {1}, {5});
  // Along the last axis of [2, 4].
  out = run_op({"Split", {f32({2, 4}, iota_f(8, 1)), i64({2}, {1, 3})}, {attr_int("axis", -1)}, 2});
  expect_tensor(out[0], kF, {2, 1}, {1, 5});
  expect_tensor(out[1], kF, {2, 3}, {2, 3, 4, 6, 7, 8});
}

TEST(OnnxInterpSlice, StepsNegativeStepsAndClamping) {
  const ImportTensor x = i64({10}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
  expect_tensor(run_op1({"Slice", {x, i64({1}, {1}), i64({1}, {8}), i64({1}, {0}), i64({1}, {3})}}),
                kI, {3}, {1, 4, 7});
  expect_tensor(run_op1({"Slice", {x, i64({1}, {8}), i64({1}, {1}), omitted(), i64({1}, {-3})}}),
                kI, {3}, {8, 5, 2});
  // From the end to before the start: the whole tensor reversed (INT64_MIN clamps to -1).
  expect_tensor(run_op1({"Slice",
                         {x, i64({1}, {-1}), i64({1}, {std::numeric_limits<int64_t>::min()}),
                          i64({1}, {0}), i64({1}, {-1})}}),
                kI, {10}, {9, 8, 7, 6, 5, 4, 3, 2, 1, 0});
  // Start past the end: empty; end past the end: clamped.
  expect_tensor(run_op1({"Slice", {x, i64({1}, {20}), i64({1}, {30})}}), kI, {0}, {});
  expect_tensor(
      run_op1({"Slice", {x, i64({1}, {-3}), i64({1}, {std::numeric_limits<int64_t>::max()})}}), kI,
      {3}, {7, 8, 9});
  // 2-d [3, 4], axes [-1, 0] out of order, steps 2: rows 0 and 2, columns 1 and 3.
  expect_tensor(run_op1({"Slice",
                         {f32({3, 4}, iota_f(12)), i64({2}, {1, 0}), i64({2}, {100, 3}),
                          i64({2}, {-1, 0}), i64({2}, {2, 2})}}),
                kF, {2, 2}, {1, 3, 9, 11});
}

TEST(OnnxInterpGather, GatherNegativeIndicesAndAxes) {
  const ImportTensor data = f32({3, 2}, {1, 2, 3, 4, 5, 6});
  expect_tensor(run_op1({"Gather", {data, i64({2}, {2, -3})}}), kF, {2, 2}, {5, 6, 1, 2});
  expect_tensor(run_op1({"Gather", {data, i64({}, {1})}, {attr_int("axis", 1)}}), kF, {3},
                {2, 4, 6});
  expect_tensor(run_op1({"Gather", {data, i32({2, 1}, {1, 0})}, {attr_int("axis", -1)}}), kF,
                {3, 2, 1}, {2, 1, 4, 3, 6, 5});
  // The embedding lookup of the exports: [vocab, hidden] by [batch, seq] ids.
  expect_tensor(run_op1({"Gather", {data, i64({1, 2}, {2, 0})}}), kF, {1, 2, 2}, {5, 6, 1, 2});
}

TEST(OnnxInterpGather, GatherNDTuplesSlicesAndBatchDims) {
  const ImportTensor data = f32({2, 2}, {0, 1, 2, 3});
  expect_tensor(run_op1({"GatherND", {data, i64({2, 2}, {0, 0, 1, 1})}}), kF, {2}, {0, 3});
  expect_tensor(run_op1({"GatherND", {data, i64({2, 1}, {1, 0})}}), kF, {2, 2}, {2, 3, 0, 1});
  // ONNX's batch_dims example: [[[0,1],[2,3]],[[4,5],[6,7]]], [[1],[0]] -> [[2,3],[4,5]].
  expect_tensor(run_op1({"GatherND",
                         {f32({2, 2, 2}, iota_f(8)), i64({2, 1}, {1, 0})},
                         {attr_int("batch_dims", 1)}}),
                kF, {2, 2}, {2, 3, 4, 5});
  // Negative indices count from the end.
  expect_tensor(run_op1({"GatherND", {data, i64({1, 2}, {-1, -2})}}), kF, {1}, {2});
}

TEST(OnnxInterpConstant, ConstantAttributes) {
  expect_tensor(run_op1({"Constant", {}, {attr_ints("value_ints", {1, 2})}}), kI, {2}, {1, 2});
  expect_tensor(run_op1({"Constant", {}, {attr_float("value_float", 2.5f)}}), kF, {}, {2.5});
  expect_tensor(run_op1({"Constant", {}, {attr_tensor("value", f32({2, 1}, {3, 4}))}}), kF, {2, 1},
                {3, 4});
  expect_tensor(run_op1({"Constant", {}, {attr_int("value_int", -7)}}), kI, {}, {-7});
}

TEST(OnnxInterpConstant, ConstantOfShapeShapeRangeIdentity) {
  expect_tensor(
      run_op1({"ConstantOfShape", {i64({2}, {2, 3})}, {attr_tensor("value", i64({1}, {7}))}}), kI,
      {2, 3}, std::vector<double>(6, 7));
  expect_tensor(run_op1({"ConstantOfShape", {i64({1}, {2})}}), kF, {2}, {0, 0});
  expect_tensor(
      run_op1({"ConstantOfShape", {i64({0}, {})}, {attr_tensor("value", f32({1}, {1.5f}))}}), kF,
      {}, {1.5});

  const ImportTensor x = f32({2, 3, 4}, iota_f(24));
  expect_tensor(run_op1({"Shape", {x}}), kI, {3}, {2, 3, 4});
  // Opset 15's start and end (negative ones count from the end, out of range ones clamp).
  expect_tensor(run_op1({"Shape", {x}, {attr_int("start", 1)}, 1, 15}), kI, {2}, {3, 4});
  expect_tensor(run_op1({"Shape", {x}, {attr_int("end", -1)}, 1, 15}), kI, {2}, {2, 3});
  expect_tensor(run_op1({"Shape", {x}, {attr_int("start", -10), attr_int("end", 10)}, 1, 15}), kI,
                {3}, {2, 3, 4});

  expect_tensor(run_op1({"Range", {i64({}, {1}), i64({}, {10}), i64({}, {3})}}), kI, {3},
                {1, 4, 7});
  expect_tensor(run_op1({"Range", {f32({}, {0}), f32({}, {1}), f32({}, {0.25f})}}), kF, {4},
                {0, 0.25, 0.5, 0.75});
  expect_tensor(run_op1({"Range", {i64({}, {5}), i64({}, {1}), i64({}, {-2})}}), kI, {2}, {5, 3});
  expect_tensor(run_op1({"Range", {i64({}, {0}), i64({}, {0}), i64({}, {1})}}), kI, {0}, {});

  expect_tensor(run_op1({"Identity", {i64({2}, {4, 5})}}), kI, {2}, {4, 5});
}

// Shapes known from the inputs' concrete dimensions fold Shape subgraphs; values that depend
// on input data do not fold; Constant chains fold with or without inputs.
TEST(OnnxInterpFold, ShapeSubgraphsFoldForConcreteInputShapes) {
  OnnxModel m;
  m.path = "fold_test.onnx";
  m.opset = 17;
  OnnxValueInfo x;
  x.name = "x";
  x.type = OnnxElemType::kFloat;
  x.shape = std::vector<OnnxDim>{OnnxDim{-1, "batch"}, OnnxDim{4, ""}};
  m.graph.inputs.push_back(x);
  auto node = [&](const std::string& op, std::vector<std::string> in, std::string out,
                  std::vector<OnnxAttribute> attrs = {}) {
    OnnxNode n;
    n.name = op + "_" + out;
    n.op_type = op;
    n.inputs = std::move(in);
    n.outputs = {std::move(out)};
    n.attributes = std::move(attrs);
    m.graph.nodes.push_back(n);
  };
  // new_shape = Concat(Shape(x)[0:1], [2, 2]); y = Reshape(x, new_shape) * 2
  node("Shape", {"x"}, "s");
  node("Constant", {}, "zero", {attr_ints("value_ints", {0})});
  node("Gather", {"s", "zero"}, "b");
  node("Constant", {}, "tail", {attr_ints("value_ints", {2, 2})});
  node("Concat", {"b", "tail"}, "new_shape", {attr_int("axis", 0)});
  node("Reshape", {"x", "new_shape"}, "r");
  node("Constant", {}, "two", {attr_float("value_float", 2)});
  node("Mul", {"r", "two"}, "y");
  OnnxValueInfo y;
  y.name = "y";
  m.graph.outputs.push_back(y);
  const ImportGraph g = ImportGraph::build(m);

  // Declared shapes alone: batch is symbolic, so only the three Constants fold.
  const FoldedGraph declared = fold_import_graph(g);
  EXPECT_EQ(declared.folded_nodes, 3);
  EXPECT_FALSE(declared.known[g.find_value("r")].has_shape());
  // With x = [3, 4]: Shape, Gather and Concat fold too; Reshape and Mul are shaped, not folded.
  const FoldedGraph concrete = fold_import_graph(g, {{"x", {3, 4}}});
  EXPECT_EQ(concrete.folded_nodes, 6);
  EXPECT_EQ(concrete.remaining.size(), 2u);
  const ImportTensor& shape = concrete.known[g.find_value("new_shape")];
  ASSERT_TRUE(shape.has_data());
  EXPECT_EQ(shape.to_int64s(), (std::vector<int64_t>{3, 2, 2}));
  const ImportTensor& out = concrete.known[g.find_value("y")];
  ASSERT_TRUE(out.has_shape());
  EXPECT_FALSE(out.has_data());
  EXPECT_EQ(out.shape(), (Shape{3, 2, 2}));

  ImportRunStats stats;
  const auto result = run_import_graph(g, {{"x", f32({3, 4}, iota_f(12))}}, &stats);
  EXPECT_EQ(stats.folded_nodes, 6);
  EXPECT_EQ(stats.executed_nodes, 2);
  std::vector<double> want;
  for (int i = 0; i < 12; ++i) want.push_back(2.0 * i);
  expect_tensor(result.at("y"), kF, {3, 2, 2}, want);
}

}  // namespace
}  // namespace kiln
