// The Linear's typed description (graph/linear.h): named operands, the epilogue, the fused
// extras a node needs, and the registry that matches them and derives every backend's refusal.
#include <gtest/gtest.h>

#include "backend_ops.h"
#include "graph/attrs.h"
#include "graph/builder.h"
#include "graph/linear.h"
#include "graph/verifier.h"
#include "passes/pass.h"

namespace kiln::test {
namespace {

const Logger& quiet() {
  static const Logger log(LogLevel::kSilent);
  return log;
}

// x [tokens, 8] -> Linear(w [4, 8], bias) -> y; the Linear is the graph's last node.
Graph one_linear(bool bias) {
  Gen g(DType::kF32, DType::kF32, 7);
  GraphBuilder b("linear");
  const int x = b.input("x", DType::kF32, {kTokens, Dim::of(8)});
  b.output(
      b.linear(x, b.weight("w", g.random({4, 8})), bias ? b.weight("b", g.random({4})) : -1, "fc"),
      "y");
  return b.finish();
}

// y = Linear(x) (+ bias) + r, the Add fused into the Linear by fuse_linear_residual.
Graph fused_residual(bool bias) {
  Gen g(DType::kF32, DType::kF32, 3);
  GraphBuilder b("residual");
  const int x = b.input("x", DType::kF32, {kTokens, Dim::of(8)});
  const int r = b.input("r", DType::kF32, {kTokens, Dim::of(4)});
  const int fc =
      b.linear(x, b.weight("w", g.random({4, 8})), bias ? b.weight("b", g.random({4})) : -1, "fc");
  b.output(b.add(fc, r, "add"), "y");
  Graph fused = b.finish();
  KILN_CHECK(fuse_linear_residual(fused, quiet()) == 1, "the residual add was not fused");
  verify_graph(fused);
  return fused;
}

TEST(LinearDesc, NamesOperandsAndExtrasOfAPlainLinear) {
  const Graph g = one_linear(true);
  const Node& fc = g.nodes.back();
  const LinearDesc d = describe_linear(fc);
  EXPECT_EQ(d.operand(LinearOperand::kX), g.inputs[0]);
  EXPECT_EQ(g.values[d.operand(LinearOperand::kWeight)].name, "w");
  EXPECT_EQ(g.values[d.operand(LinearOperand::kBias)].name, "b");
  for (LinearOperand o :
       {LinearOperand::kWeightScales, LinearOperand::kResidual, LinearOperand::kNormRowSums,
        LinearOperand::kNormScale, LinearOperand::kRows})
    EXPECT_FALSE(d.has(o)) << linear_operand_name(o);
  EXPECT_EQ(d.extras(), (ExtraSet{Extra::kBias}));
  EXPECT_TRUE(describe_linear(one_linear(false).nodes.back()).extras().empty());
  EXPECT_EQ(node_extras(fc), d.extras());
}

TEST(LinearDesc, SetOperandGrowsTheInputsAndAbsentStaysShort) {
  Graph g = one_linear(false);
  Node& fc = g.nodes.back();
  const size_t before = fc.inputs.size();
  set_linear_operand(fc, LinearOperand::kRows, -1);  // absent: nothing to store
  EXPECT_EQ(fc.inputs.size(), before);
  set_linear_operand(fc, LinearOperand::kResidual, g.inputs[0]);
  ASSERT_EQ(fc.inputs.size(), slot(LinearOperand::kResidual) + 1);
  EXPECT_EQ(linear_operand(fc, LinearOperand::kResidual), g.inputs[0]);
  EXPECT_EQ(linear_operand(fc, LinearOperand::kRows), -1);
  EXPECT_TRUE(describe_linear(fc).extras().has(Extra::kResidual));
  // Not a Linear: refused by name.
  Node add{OpKind::kAdd, "sum", {0, 0}, {1}, NoAttrs{}};
  EXPECT_THROW(set_linear_operand(add, LinearOperand::kBias, 0), Error);
  EXPECT_TRUE(node_extras(add).empty());
}

// Each fusion pass leaves its extra in the description, through the named operands.
TEST(LinearDesc, FusionPassesSetTheirExtras) {
  {
    const Graph fused = fused_residual(false);
    const LinearDesc d = describe_linear(fused.nodes.back());
    EXPECT_EQ(d.operand(LinearOperand::kResidual), fused.inputs[1]);
    EXPECT_EQ(d.extras(), (ExtraSet{Extra::kResidual}));
  }
  {
    Gen g(DType::kF32, DType::kF32, 4);
    GraphBuilder b("norm");
    const int x = b.input("x", DType::kF32, {kTokens, Dim::of(8)});
    const int y =
        b.layer_norm(x, b.weight("nw", g.random({8})), b.weight("nb", g.random({8})), 1e-5, "ln");
    b.output(b.linear(y, b.weight("w", g.random({4, 8})), -1, "fc"), "y");
    Graph fused = b.finish();
    ASSERT_EQ(fuse_norm_linear(fused, quiet()), 1);
    verify_graph(fused);
    const LinearDesc d = describe_linear(fused.nodes.back());
    EXPECT_EQ(d.operand(LinearOperand::kX), fused.inputs[0]);
    EXPECT_TRUE(d.has(LinearOperand::kNormRowSums));
    EXPECT_EQ(d.epilogue.norm, InputNorm::kLayerNorm);
    EXPECT_EQ(d.extras(), (ExtraSet{Extra::kBias, Extra::kLayerNormFold}));
  }
  {
    Gen g(DType::kF32, DType::kF32, 5);
    GraphBuilder b("gather");
    const int x = b.input("x", DType::kF32, {kTokens, Dim::of(8)});
    const int rows = b.input("rows", DType::kI64, {Dim::sym("rows")});
    b.output(b.linear(b.gather_rows(x, rows, "gather"), b.weight("w", g.random({4, 8})), -1, "fc"),
             "y");
    Graph fused = b.finish();
    ASSERT_EQ(fuse_gather_linear(fused, quiet()), 1);
    verify_graph(fused);
    const LinearDesc d = describe_linear(fused.nodes.back());
    EXPECT_EQ(d.operand(LinearOperand::kRows), fused.inputs[1]);
    EXPECT_EQ(d.extras(), (ExtraSet{Extra::kGatheredRows}));
  }
}

// Plans store the epilogue under the keys they always had: no plan format change.
TEST(LinearDesc, EpilogueKeepsThePlanKeys) {
  LinearAttrs a;
  a.epilogue.activation = Activation::kGeluTanh;
  a.epilogue.norm = InputNorm::kRmsNorm;
  a.epilogue.norm_eps = 1e-6;
  a.epilogue.widen = true;
  a.tf32 = true;
  const nlohmann::json j = attrs_to_json(a);
  EXPECT_EQ(j, nlohmann::json::parse(R"({"activation": "gelu_tanh", "norm": "rms_norm",
                                         "norm_eps": 1e-6, "widen": true, "tf32": true})"));
  EXPECT_EQ(std::get<LinearAttrs>(attrs_from_json(j, AttrKind::kLinear, "test")), a);
}

TEST(LinearDesc, DescribesExtraSetsInOrder) {
  EXPECT_EQ(describe_extras({}), "none");
  EXPECT_EQ(describe_extras({Extra::kResidual}), "fused residual");
  EXPECT_EQ(describe_extras({Extra::kWidenedOutput, Extra::kBias, Extra::kActivation}),
            "bias, fused activation and widened f32 output");
  EXPECT_EQ(ExtraSet({Extra::kBias, Extra::kResidual}).missing_from({Extra::kBias}),
            ExtraSet{Extra::kResidual});
  EXPECT_TRUE(ExtraSet::all().has(Extra::kWidenedOutput));
}

KernelFactory no_kernel() {
  return [](const Node&) -> std::unique_ptr<Kernel> { return nullptr; };
}

// The registry gives a node the first entry of its key that implements all its extras, falling
// back to narrower CPU families, and says what is missing when none does.
TEST(LinearDesc, RegistryMatchesExtrasAndDerivesTheRefusal) {
  const KernelKey avx2{OpKind::kLinear, DType::kF32, DType::kF32, Device::kCpu, Isa::kAvx2};
  KernelKey avx512 = avx2;
  avx512.isa = Isa::kAvx512;
  KernelRegistry r;
  r.add(avx2, "plain", no_kernel(), {Extra::kBias, Extra::kActivation});
  r.add(avx2, "with residual", no_kernel(), {Extra::kBias, Extra::kResidual});
  EXPECT_THROW(r.add(avx2, "again", no_kernel(), {Extra::kActivation, Extra::kBias}), Error);

  EXPECT_EQ(r.find(avx2, {})->name, "plain");
  EXPECT_EQ(r.find(avx512, {Extra::kBias})->name, "plain");  // AVX-512 falls back to AVX2
  EXPECT_EQ(r.find(avx2, {Extra::kResidual})->name, "with residual");
  EXPECT_EQ(r.unsupported_reason(avx512, {Extra::kBias, Extra::kResidual}, "cpu"), "");

  // Residual and activation each have a kernel, but not one kernel.
  const std::string both =
      r.unsupported_reason(avx2, {Extra::kActivation, Extra::kResidual}, "cpu");
  EXPECT_EQ(r.find(avx2, {Extra::kActivation, Extra::kResidual}), nullptr);
  EXPECT_NE(both.find("fused activation and fused residual together"), std::string::npos) << both;

  // An extra no entry implements is named, with what the entries do implement.
  const std::string norm = r.unsupported_reason(avx2, {Extra::kBias, Extra::kRmsNormFold}, "cpu");
  EXPECT_EQ(norm,
            "the cpu kernels for Linear (f32 activations, f32 weights) on cpu avx2 take no folded "
            "input norm (rms norm) (they implement: bias, fused activation and fused residual)");
  // A key without entries.
  KernelKey bf16 = avx2;
  bf16.weight = DType::kBF16;
  EXPECT_EQ(r.unsupported_reason(bf16, {}, "cpu"),
            "no cpu kernel for Linear (f32 activations, bf16 weights) on cpu avx2");
  // ... and the extras no kernel of the op takes at all.
  EXPECT_EQ(r.unsupported_reason(bf16, {Extra::kResidual, Extra::kGatheredRows}, "cpu"),
            "no cpu kernel for Linear (f32 activations, bf16 weights) on cpu avx2, and no cpu "
            "Linear kernel takes gathered rows");
}

// Every CPU backend's refusal of a CUDA plan's fusions comes from its registry entries: it names
// the extra the node needs and lists what the CPU Linears state they implement; the reference
// implements every extra.
TEST(LinearDesc, BackendRefusalsComeFromTheirRegistryEntries) {
  Graph g = one_linear(true);
  Node& fc = g.nodes.back();
  fc.attr<LinearAttrs>().epilogue.activation = Activation::kRelu;
  const Graph fused = fused_residual(true);
  const Node& with_residual = fused.nodes.back();
  const std::unique_ptr<Backend> reference = reference_backend();
  EXPECT_EQ(reference->unsupported_reason(fused, with_residual), "");
  const std::string cpu_linear = describe_extras({Extra::kBias, Extra::kActivation});
  int refused = 0;
  for (NamedBackend& nb : available_backends()) {
    EXPECT_EQ(nb.backend->unsupported_reason(g, fc), "") << nb.name;
    if (nb.backend->device() != Device::kCpu) continue;
    const std::string why = nb.backend->unsupported_reason(fused, with_residual);
    EXPECT_NE(why.find("take no fused residual"), std::string::npos) << nb.name << ": " << why;
    EXPECT_NE(why.find("(they implement: " + cpu_linear + ")"), std::string::npos)
        << nb.name << ": " << why;
    ++refused;
  }
  EXPECT_GT(refused, 0);
}

}  // namespace
}  // namespace kiln::test
