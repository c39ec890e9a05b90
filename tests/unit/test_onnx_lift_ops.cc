// Single lifts on small graphs written with the protobuf API: erf GELU (the fixture exports only
// hold tanh GELU) lifts as exact GELU and covers its nodes; a look-alike with another constant
// does not lift and says why.
#include <gtest/gtest.h>

#include <cmath>

#include "frontend/onnx/lift_model.h"
#include "frontend/onnx/lift_ops.h"
#include "onnx_test_models.h"

namespace kiln {
namespace {

// Y = X * 0.5 * (1 + Erf(X / c)) for X float [batch, 8]: GELU when c = sqrt(2).
std::string erf_gelu_model(float c) {
  ::onnx::ModelProto m;
  m.set_ir_version(8);
  auto* op = m.add_opset_import();
  op->set_domain("");
  op->set_version(17);
  auto* g = m.mutable_graph();
  g->set_name("gelu");
  onnx_test::set_value_info(g->add_input(), "X", ::onnx::TensorProto::FLOAT, {"batch", 8});
  onnx_test::set_value_info(g->add_output(), "Y", ::onnx::TensorProto::FLOAT, {"batch", 8});
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

}  // namespace
}  // namespace kiln
