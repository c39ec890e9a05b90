#include "quant_linear_cases.h"

#include <gtest/gtest.h>

#include <cmath>

#include "../models/graph_runner.h"
#include "graph/builder.h"
#include "graph/linear.h"
#include "graph/verifier.h"
#include "passes/pass.h"
#include "passes/quantize_weights.h"

namespace kiln::test {

Int8Weight int8_weight(Gen& g, int64_t rows, int64_t cols) {
  const std::vector<float> v = g.floats(rows * cols, -1.0f, 1.0f);
  std::vector<int8_t> q(v.size());
  for (size_t i = 0; i < v.size(); ++i) q[i] = static_cast<int8_t>(std::lround(v[i] * 127.0f));
  q.front() = 127;
  q.back() = -127;
  return {Tensor::from_vector(q, {rows, cols}),
          Tensor::from_vector(g.floats(rows, 0.001f, 0.05f), {rows})};
}

bool folds_norm(Variant v) {
  return v == Variant::kLayerNorm || v == Variant::kRmsNorm || v == Variant::kLayerNormNoBias;
}
bool widens(Variant v) { return v == Variant::kWidened || v == Variant::kGatheredWidened; }
const char* variant_name(Variant v) {
  switch (v) {
    case Variant::kPlain:
      return "plain";
    case Variant::kBiasAct:
      return "bias+gelu";
    case Variant::kF32Bias:
      return "f32 bias";
    case Variant::kResidual:
      return "residual";
    case Variant::kWidened:
      return "f32 output";
    case Variant::kGatheredWidened:
      return "gathered rows, f32 output";
    case Variant::kLayerNorm:
      return "folded layer norm";
    case Variant::kRmsNorm:
      return "folded rms norm";
    case Variant::kLayerNormNoBias:
      return "folded layer norm, no bias";
  }
  return "?";
}

Graph int8_linear_graph(Gen& g, DType dtype, int64_t in, int64_t out, Variant variant, bool fuse,
                        bool int4, float input_scale, bool fp8) {
  GraphBuilder b("int8_linear");
  const int x = b.input("x", dtype, {kTokens, Dim::of(in)});
  int h = x;
  if (variant == Variant::kGatheredWidened)
    h = b.gather_rows(x, b.input("rows", DType::kI64, {Dim::sym("rows")}), "gather");
  if (variant == Variant::kLayerNorm || variant == Variant::kLayerNormNoBias)
    h = b.layer_norm(x, b.weight("nw", Tensor::from_vector(g.floats(in, 0.5f, 1.5f), {in})),
                     b.weight("nb", Tensor::from_vector(g.floats(in, -0.5f, 0.5f), {in})), 1e-5,
                     "ln");
  if (variant == Variant::kRmsNorm)
    h = b.rms_norm(x, b.weight("nw", Tensor::from_vector(g.floats(in, 0.5f, 1.5f), {in})), 1e-6,
                   "rms");
  Int8Weight w = int8_weight(g, out, in);
  if (int4) {
    Int4Weight w4 = int4_weight(g, out, in);
    w = {std::move(w4.q), std::move(w4.scales)};
  }
  if (fp8) {  // E4M3 codes over the whole range (±448 included), per-channel scales
    Tensor values = Tensor::from_vector(g.floats(out * in, -1.0f, 1.0f), {out, in});
    values.data<float>()[0] = 1.0f;
    values.data<float>()[out * in - 1] = -1.0f;
    quantize_rows_fp8(values, &w.q, &w.scales);
  }
  int bias = -1;
  if (variant == Variant::kBiasAct || variant == Variant::kLayerNorm)
    bias = b.weight("b", g.random({out}));
  if (variant == Variant::kF32Bias) bias = b.weight("b", Tensor::from_vector(g.floats(out), {out}));
  int y = b.linear_quantized(h, b.weight("w", std::move(w.q)), bias,
                             b.weight("w.scales", std::move(w.scales)), "fc");
  if (variant == Variant::kBiasAct) y = b.activation(y, Activation::kGeluTanh, "act");
  if (variant == Variant::kResidual)
    y = b.add(y, b.input("r", dtype, {kTokens, Dim::of(out)}), "residual");
  if (widens(variant)) y = b.cast(y, DType::kF32, "to_f32");
  b.output(y, "y");
  Graph graph = b.finish();
  if (!fuse) return graph;
  const Logger quiet(LogLevel::kSilent);
  if (folds_norm(variant)) {
    EXPECT_EQ(fuse_norm_linear(graph, quiet), 1) << variant_name(variant);
  }
  fuse_linear_activation(graph, quiet);
  fuse_linear_residual(graph, quiet);
  fuse_linear_cast(graph, quiet);
  fuse_gather_linear(graph, quiet);
  if (input_scale >= 0.0f) {
    EXPECT_FALSE(folds_norm(variant) || int4) << "W8A8 Linears take no norm and int8 weights";
    const int id =
        graph.add_weight("fc.input_scale", Tensor::from_vector<float>({input_scale}, {1}));
    set_linear_operand(graph.nodes[0], LinearOperand::kInputScale, id);
  }
  verify_graph(graph);
  EXPECT_EQ(graph.nodes.size(), 1u) << variant_name(variant) << ": one fused Linear";
  return graph;
}

int compare_on_cuda(Backend& reference, std::vector<NamedBackend>& backends, Gen& g,
                    const Graph& graph, int64_t n, int64_t in, int64_t out, Variant variant,
                    const Check& check, const std::string& what) {
  std::vector<NamedBackend*> runners;
  for (NamedBackend& nb : backends)
    if (nb.name.starts_with("cuda") && unsupported(*nb.backend, graph).empty())
      runners.push_back(&nb);
  if (runners.empty()) return 0;
  std::map<std::string, Tensor> feed = {{"x", g.random({n, in}, -2, 2)}};
  if (variant == Variant::kResidual) feed["r"] = g.random({n, out}, -2, 2);
  if (variant == Variant::kGatheredWidened) {
    std::vector<int64_t> rows(static_cast<size_t>(n));
    for (int64_t r = 0; r < n; ++r) rows[static_cast<size_t>(r)] = (r * 7 + 3) % (n + 5);
    rows.back() = rows.front();
    feed["x"] = g.random({n + 5, in}, -2, 2);
    feed["rows"] = Tensor::from_vector(rows, {n});
  }
  const Scenario sc = one_step(graph, feed);
  const ScenarioOutputs ref = run_scenario(reference, sc);
  for (NamedBackend* nb : runners)
    expect_matches(run_scenario(*nb->backend, sc)[0][0], ref[0][0], check, nb->name + " " + what);
  return static_cast<int>(runners.size());
}

std::string case_name(DType dtype, Variant variant, int64_t n, int64_t in, int64_t out) {
  return std::string(dtype_name(dtype)) + " " + variant_name(variant) + " [" + std::to_string(n) +
         ", " + std::to_string(in) + "] x [" + std::to_string(out) + ", " + std::to_string(in) +
         "]^T";
}

}  // namespace kiln::test
