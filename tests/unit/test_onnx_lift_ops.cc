// Single lifts on small graphs written with the protobuf API: erf GELU (the fixture exports only
// hold tanh GELU) lifts as exact GELU and covers its nodes; a look-alike with another constant
// does not lift and says why. HF T5's fp16 overflow clamp is recognised (and looked through);
// Clips that only look like it are not.
#include <gtest/gtest.h>

#include <cmath>

#include "frontend/onnx/lift_model.h"
#include "frontend/onnx/lift_ops.h"
#include "onnx_test_models.h"

namespace kiln {
namespace {

// An opset-17 model whose graph `name` reads X and writes Y, both float [batch, 8].
::onnx::ModelProto model_x_to_y(const std::string& name) {
  ::onnx::ModelProto m;
  m.set_ir_version(8);
  auto* op = m.add_opset_import();
  op->set_domain("");
  op->set_version(17);
  auto* g = m.mutable_graph();
  g->set_name(name);
  onnx_test::set_value_info(g->add_input(), "X", ::onnx::TensorProto::FLOAT, {"batch", 8});
  onnx_test::set_value_info(g->add_output(), "Y", ::onnx::TensorProto::FLOAT, {"batch", 8});
  return m;
}

// Y = X * 0.5 * (1 + Erf(X / c)) for X float [batch, 8]: GELU when c = sqrt(2).
std::string erf_gelu_model(float c) {
  ::onnx::ModelProto m = model_x_to_y("gelu");
  auto* g = m.mutable_graph();
  onnx_test::add_raw_float(g, "c", {}, {c});
  onnx_test::add_raw_float(g, "one", {}, {1.0f});
  onnx_test::add_raw_float(g, "half", {}, {0.5f});
  onnx_test::add_node(g, "Div", "div", {"X", "c"}, {"scaled"});
  onnx_test::add_node(g, "Erf", "erf", {"scaled"}, {"e"});
  onnx_test::add_node(g, "Add", "add", {"e", "one"}, {"e1"});
  onnx_test::add_node(g, "Mul", "mul", {"X", "e1"}, {"xe"});
  onnx_test::add_node(g, "Mul", "half_mul", {"xe", "half"}, {"Y"});
  return onnx_test::write_model(m, onnx_test::test_dir() + "/gelu.onnx");
}

TEST(OnnxLiftOps, ErfGeluLiftsAsExactGelu) {
  const ImportGraph graph =
      ImportGraph::build(read_onnx_model(erf_gelu_model(static_cast<float>(std::sqrt(2.0)))));
  const PatternGraph pattern(graph, lift_probe_shapes(graph));
  const LiftResult lifted = lift_import_graph(pattern, Logger(LogLevel::kSilent));
  ASSERT_EQ(lifted.ops.size(), 1u);
  EXPECT_EQ(lifted.ops[0].kind, LiftedKind::kGelu);
  EXPECT_EQ(lifted.ops[0].activation, Activation::kGeluExact);
  EXPECT_EQ(lifted.ops[0].nodes.size(), graph.nodes().size());
  EXPECT_EQ(pattern.value_name(lifted.ops[0].output), "Y");
  EXPECT_TRUE(lifted.generic_nodes.empty());
  EXPECT_TRUE(lifted.failures.empty());
}

TEST(OnnxLiftOpsBadInput, GeluLookAlikeDoesNotLift) {
  const ImportGraph graph = ImportGraph::build(read_onnx_model(erf_gelu_model(1.3f)));
  const PatternGraph pattern(graph, lift_probe_shapes(graph));
  const LiftResult lifted = lift_import_graph(pattern, Logger(LogLevel::kSilent));
  EXPECT_TRUE(lifted.ops.empty());
  ASSERT_EQ(lifted.failures.size(), 1u);
  EXPECT_EQ(lifted.failures[0].pattern, "gelu");
  EXPECT_EQ(lifted.failures[0].node, "erf");
  EXPECT_NE(lifted.failures[0].reason.find("computes neither tanh GELU"), std::string::npos)
      << lifted.failures[0].reason;
  EXPECT_EQ(lifted.generic_nodes.size(), graph.nodes().size());
}

// Y = Clip(X, -b, b) + 0 for X float [batch, 8]. HF's clamp (`kind` "hf"): b = Where(
// ReduceSum(Cast(IsInf(Cast(X, double)), int64)) > 0, hi - 1000, hi). "constant": b = hi, an
// initializer. "other_input": the IsInf tests another input Z, not X.
std::string clamp_model(const std::string& kind, float hi) {
  ::onnx::ModelProto m = model_x_to_y("clamp");
  auto* g = m.mutable_graph();
  if (kind == "other_input")
    onnx_test::set_value_info(g->add_input(), "Z", ::onnx::TensorProto::FLOAT, {"batch", 8});
  onnx_test::add_raw_float(g, "zero", {}, {0.0f});
  auto cast = [&](const std::string& name, const std::string& in, const std::string& out, int to) {
    auto* a = onnx_test::add_node(g, "Cast", name, {in}, {out})->add_attribute();
    a->set_name("to");
    a->set_type(::onnx::AttributeProto::INT);
    a->set_i(to);
  };
  if (kind == "constant") {
    onnx_test::add_raw_float(g, "b", {}, {hi});
  } else {
    cast("to_double", kind == "other_input" ? "Z" : "X", "xd", ::onnx::TensorProto::DOUBLE);
    onnx_test::add_node(g, "IsInf", "isinf", {"xd"}, {"inf"});
    cast("to_int", "inf", "flags", ::onnx::TensorProto::INT64);
    auto* sum = onnx_test::add_node(g, "ReduceSum", "any", {"flags"}, {"count"});
    auto* keep = sum->add_attribute();
    keep->set_name("keepdims");
    keep->set_type(::onnx::AttributeProto::INT);
    keep->set_i(0);
    auto* zero = g->add_initializer();
    zero->set_name("zero_i");
    zero->set_data_type(::onnx::TensorProto::INT64);
    zero->add_int64_data(0);
    onnx_test::add_node(g, "Greater", "greater", {"count", "zero_i"}, {"any_inf"});
    onnx_test::add_raw_float(g, "lowered", {}, {hi - 1000});
    onnx_test::add_raw_float(g, "highest", {}, {hi});
    onnx_test::add_node(g, "Where", "where", {"any_inf", "lowered", "highest"}, {"b"});
  }
  onnx_test::add_node(g, "Neg", "neg", {"b"}, {"minus_b"});
  onnx_test::add_node(g, "Clip", "clip", {"X", "minus_b", "b"}, {"clipped"});
  onnx_test::add_node(g, "Add", "add", {"clipped", "zero"}, {"Y"});
  return onnx_test::write_model(m, onnx_test::test_dir() + "/clamp_" + kind + ".onnx");
}

// The lifted fp16_clamp ops of a model, and the nodes left generic.
std::pair<std::vector<LiftedOp>, size_t> clamps_of(const std::string& path, int* add_input) {
  const ImportGraph graph = ImportGraph::build(read_onnx_model(path));
  const PatternGraph pattern(graph, lift_probe_shapes(graph));
  const LiftResult lifted = lift_import_graph(pattern, Logger(LogLevel::kSilent));
  std::vector<LiftedOp> clamps;
  for (const LiftedOp& op : lifted.ops)
    if (op.kind == LiftedKind::kOverflowClamp) clamps.push_back(op);
  // What the Add reads, through casts and clamps: X itself when the clamp is looked through.
  for (int n : graph.order())
    if (graph.nodes()[n].op_type == "Add")
      *add_input = pattern.value_name(pattern.through_casts(graph.nodes()[n].inputs[0])) == "X";
  return {clamps, lifted.generic_nodes.size()};
}

TEST(OnnxLiftOps, HfFp16OverflowClampIsLookedThrough) {
  int add_reads_x = 0;
  const auto [clamps, generic] = clamps_of(clamp_model("hf", 65504), &add_reads_x);
  ASSERT_EQ(clamps.size(), 1u);
  EXPECT_EQ(clamps[0].anchor, "clip");
  // The Clip and the 7 nodes computing its bounds; the Add alone stays generic.
  EXPECT_EQ(clamps[0].nodes.size(), 8u);
  EXPECT_EQ(generic, 1u);
  EXPECT_EQ(add_reads_x, 1);
}

TEST(OnnxLiftOpsBadInput, ClipsThatOnlyLookLikeTheClampAreNotLookedThrough) {
  for (const auto& [kind, hi] :
       {std::pair<std::string, float>{"constant", 65504}, {"hf", 6}, {"other_input", 65504}}) {
    int add_reads_x = 0;
    const auto [clamps, generic] = clamps_of(clamp_model(kind, hi), &add_reads_x);
    EXPECT_TRUE(clamps.empty()) << kind << " " << hi;
    EXPECT_EQ(add_reads_x, 0) << kind << " " << hi;
    EXPECT_GE(generic, 2u) << kind << " " << hi;  // the Clip and the Add at least
  }
}

// Tied embeddings are found by comparing tables: of one type byte for byte, of two types as
// floats chunk by chunk (a table of more than one chunk here: 3 x 5000 elements).
TEST(OnnxLiftOps, SameValuesComparesAcrossTypesWithoutWholeCopies) {
  std::vector<float> v(15000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 251) * 0.25f;
  const Tensor f32 = Tensor::from_vector(v, {3, 5000});
  const Tensor f16 = f32.to(DType::kF16);  // every value is exact in fp16
  EXPECT_TRUE(same_values(f32, f32.clone()));
  EXPECT_TRUE(same_values(f32, f16));
  EXPECT_TRUE(same_values(f16, f32));
  std::vector<float> w = v;
  w.back() += 0.25f;  // the last chunk differs
  EXPECT_FALSE(same_values(f32, Tensor::from_vector(w, {3, 5000})));
  EXPECT_FALSE(same_values(f16, Tensor::from_vector(w, {3, 5000})));
  EXPECT_FALSE(same_values(f32, Tensor::from_vector(v, {5000, 3}))) << "shapes differ";
}

}  // namespace
}  // namespace kiln
