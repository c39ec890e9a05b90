// Int8 weights with fp16/bf16 activations (and f32: fp16 T5's FFN output projections): the Linear
// and Embedding of CUDA's int8-weight plans, against the reference backend (which decodes each
// weight from its definition, q · scale, and sums in double). Row counts on the int8 GEMV (1, 3,
// 8), on the skinny tensor-core GEMM reading int8 weights (13) and on weights widened a slice of
// channels at a time for cuBLASLt (64, 65, 130; and 13 with an f32 bias); the GEMV's 8-row
// slices of batched steps under KILN_CUDA_I8_GEMV_ROWS=64 (13, 64). `in` a multiple of 8 but not
// of 16 (4104: the skinny GEMM's multiple of 32 fails there too, so it widens) and long enough
// for several passes of every lane; `out` not a multiple of the GEMV's four features, the skinny
// GEMM's 8 or the widened slices' 64; more channels than one widened slice holds (8200 at in
// 1024: two slices, the second shorter). Variants: bias of the activations' type with an
// activation, an f32 bias, a fused residual, a widened f32 output (the logits) and gathered rows
// with a widened output (the decoder's end). Skipped where no backend runs them (no GPU).
#include <gtest/gtest.h>

#include <cmath>

#include "../models/graph_runner.h"
#include "../scoped_env.h"
#include "backend_ops.h"
#include "graph/builder.h"
#include "graph/linear.h"
#include "graph/verifier.h"
#include "passes/pass.h"

namespace kiln::test {
namespace {

// q [rows, cols] over the whole int8 range (both ends included) and positive per-row scales.
struct Int8Weight {
  Tensor q, scales;
};
Int8Weight int8_weight(Gen& g, int64_t rows, int64_t cols) {
  const std::vector<float> v = g.floats(rows * cols, -1.0f, 1.0f);
  std::vector<int8_t> q(v.size());
  for (size_t i = 0; i < v.size(); ++i) q[i] = static_cast<int8_t>(std::lround(v[i] * 127.0f));
  q.front() = 127;
  q.back() = -127;
  return {Tensor::from_vector(q, {rows, cols}),
          Tensor::from_vector(g.floats(rows, 0.001f, 0.05f), {rows})};
}

enum class Variant : uint8_t {
  kPlain,
  kBiasAct,
  kF32Bias,
  kResidual,
  kWidened,
  kGatheredWidened,
  kLayerNorm,        // a LayerNorm folded into the Linear (with a bias): gamma as its norm scale
  kRmsNorm,          // an RMSNorm folded (no bias)
  kLayerNormNoBias,  // a LayerNorm folded into a Linear without a bias (the fold makes one)
};
constexpr Variant kVariants[] = {Variant::kPlain,     Variant::kBiasAct, Variant::kF32Bias,
                                 Variant::kResidual,  Variant::kWidened, Variant::kGatheredWidened,
                                 Variant::kLayerNorm, Variant::kRmsNorm, Variant::kLayerNormNoBias};
bool folds_norm(Variant v) {
  return v == Variant::kLayerNorm || v == Variant::kRmsNorm || v == Variant::kLayerNormNoBias;
}
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

// The Linear (with the nodes its variant fuses into it, fused as the CUDA pipeline fuses them;
// `fuse` false: the graph before fusing).
Graph int8_linear_graph(Gen& g, DType dtype, int64_t in, int64_t out, Variant variant,
                        bool fuse = true, bool int4 = false) {
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
  int bias = -1;
  if (variant == Variant::kBiasAct || variant == Variant::kLayerNorm)
    bias = b.weight("b", g.random({out}));
  if (variant == Variant::kF32Bias) bias = b.weight("b", Tensor::from_vector(g.floats(out), {out}));
  int y = b.linear_quantized(h, b.weight("w", std::move(w.q)), bias,
                             b.weight("w.scales", std::move(w.scales)), "fc");
  if (variant == Variant::kBiasAct) y = b.activation(y, Activation::kGeluTanh, "act");
  if (variant == Variant::kResidual)
    y = b.add(y, b.input("r", dtype, {kTokens, Dim::of(out)}), "residual");
  if (variant == Variant::kWidened || variant == Variant::kGatheredWidened)
    y = b.cast(y, DType::kF32, "to_f32");
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
  verify_graph(graph);
  EXPECT_EQ(graph.nodes.size(), 1u) << variant_name(variant) << ": one fused Linear";
  return graph;
}

// Runs `graph` (one fused quantized Linear of `variant`, [n, in] x [out, in]^T) on every CUDA
// backend that takes it and on the reference, comparing with `check`, each failure labelled with
// the backend's name and `what`; returns how many backends compared (the reference runs only
// where one does: it is slow at these sizes). The feed: x in [-2, 2), a residual likewise, and
// for gathered rows n rows of a table of n + 5, in another order, one row twice. (The CPU's
// f32-input int8 Linears quantize their inputs: test_backend_lowp.cc.)
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

// "f16 plain [n, in] x [out, in]^T"
std::string case_name(DType dtype, Variant variant, int64_t n, int64_t in, int64_t out) {
  return std::string(dtype_name(dtype)) + " " + variant_name(variant) + " [" + std::to_string(n) +
         ", " + std::to_string(in) + "] x [" + std::to_string(out) + ", " + std::to_string(in) +
         "]^T";
}

TEST(BackendOps, NarrowInt8WeightLinearsMatchReference) {
  const std::unique_ptr<Backend> reference = reference_backend();
  std::vector<NamedBackend> backends = available_backends();
  struct Shape2 {
    int64_t in, out;
  };
  int compared = 0;
  for (DType dtype : {DType::kF16, DType::kBF16, DType::kF32})
    for (const Shape2 sh : {Shape2{64, 37}, Shape2{4104, 70}, Shape2{1024, 8200}, Shape2{256, 3}})
      for (int64_t n : {1, 3, 8, 13, 64, 65, 130})
        for (Variant variant : kVariants) {
          // f32 (fp16 T5's FFN output projections) has no widened output.
          if (dtype == DType::kF32 &&
              (variant == Variant::kWidened || variant == Variant::kGatheredWidened))
            continue;
          // Every variant at 1, 13 and 65 rows (one per kernel path), the plain Linear elsewhere.
          if (variant != Variant::kPlain && n != 1 && n != 13 && n != 65) continue;
          // More channels than one widened slice (8M weights) holds: the plain Linear at 65 rows
          // and one row (the reference sums 0.5G products in double for it).
          if (sh.out == 8200 && (variant != Variant::kPlain || (n != 1 && n != 65))) continue;
          const auto seed =
              static_cast<uint32_t>(sh.in + sh.out + n + 7 * static_cast<int>(variant));
          Gen g(dtype, dtype, seed);
          const Graph graph = int8_linear_graph(g, dtype, sh.in, sh.out, variant);
          // A widened output holds values of the narrow type: its tolerance is the narrow
          // type's (the widened weights of 65 rows and more round each weight to it), as is a
          // folded norm's past one row (x standardized into the narrow type first).
          const bool widened = variant == Variant::kWidened ||
                               variant == Variant::kGatheredWidened || folds_norm(variant);
          const Check check{CheckKind::kMaxRelative, widened ? dtype_tolerance(dtype) : 0.0};
          compared += compare_on_cuda(*reference, backends, g, graph, n, sh.in, sh.out, variant,
                                      check, case_name(dtype, variant, n, sh.in, sh.out));
        }
  if (compared == 0) GTEST_SKIP() << "no backend here runs int8 weights with fp16/bf16 inputs";
}

// int4-weight plans' Linears on CUDA (int4 weights, f16 scales per group of 128 inputs, the same
// kernel as int8's): the int4 GEMV (1, 3, 8 rows; exact products, each chunk's sum times its
// group's scale), the skinny GEMM widening int4 weights times their group's scale (13, 24, 32:
// each weight rounded to the activations' type once) and widened slices on cuBLASLt (65). Shapes:
// several groups (1024), a last group of 16 (4112: not a multiple of 32, so the skinny GEMM's
// rows widen), 16-warp skinny blocks (2080: a last group of 32), wide feature tiles (4224
// features); f32 activations (fp16 T5's FFN output projections) on the GEMV and widened slices;
// folded LayerNorm and RMSNorm (in the GEMV at one row, the norm kernel first past it).
TEST(BackendOps, NarrowInt4WeightLinearsMatchReference) {
  const std::unique_ptr<Backend> reference = reference_backend();
  std::vector<NamedBackend> backends = available_backends();
  struct Shape2 {
    int64_t in, out;
  };
  int compared = 0;
  for (DType dtype : {DType::kF16, DType::kBF16, DType::kF32})
    for (const Shape2 sh :
         {Shape2{1024, 70}, Shape2{4112, 37}, Shape2{2080, 100}, Shape2{256, 4224}})
      for (int64_t n : {1, 3, 8, 13, 24, 32, 65})
        for (Variant variant : {Variant::kPlain, Variant::kBiasAct, Variant::kResidual,
                                Variant::kWidened, Variant::kGatheredWidened, Variant::kLayerNorm,
                                Variant::kRmsNorm, Variant::kLayerNormNoBias}) {
          if (dtype == DType::kF32 &&
              (variant == Variant::kWidened || variant == Variant::kGatheredWidened))
            continue;
          if (variant != Variant::kPlain && n != 1 && n != 13 && n != 65) continue;
          Gen g(dtype, dtype,
                static_cast<uint32_t>(sh.in + 3 * sh.out + n + static_cast<int>(variant)));
          const Graph graph = int8_linear_graph(g, dtype, sh.in, sh.out, variant, true, true);
          // Past the GEMV each weight times its scale is rounded to the activations' type (and
          // a folded norm's rows standardized into it past one row).
          const bool rounded = n > 8 || variant == Variant::kWidened ||
                               variant == Variant::kGatheredWidened || folds_norm(variant);
          const Check check{CheckKind::kMaxRelative, rounded ? dtype_tolerance(dtype) : 0.0};
          compared += compare_on_cuda(*reference, backends, g, graph, n, sh.in, sh.out, variant,
                                      check, "int4 " + case_name(dtype, variant, n, sh.in, sh.out));
        }
  if (compared == 0) GTEST_SKIP() << "no backend here runs int4 weights with float inputs";
}

// fuse_norm_linear on an int8 weight keeps q and its scales (gamma becomes the norm scale, the
// row sums are q · gamma's, the bias takes s * (q · beta)), on an int4 weight likewise (its row
// sums and w · beta of q times the group scales): the fused graph gives the unfused graph's
// numbers on the reference (runs everywhere), rows of small and of large mean.
TEST(BackendOps, Int8WeightFoldedNormMatchesTheUnfusedGraph) {
  const std::unique_ptr<Backend> reference = reference_backend();
  for (bool int4 : {false, true})
    for (DType dtype : {DType::kF32, DType::kF16})
      for (Variant variant : {Variant::kLayerNorm, Variant::kRmsNorm, Variant::kLayerNormNoBias})
        for (const float lo : {-2.0f, 100.0f}) {
          Gen g(dtype, dtype, static_cast<uint32_t>(11 + static_cast<int>(variant)));
          Gen g2 = g;
          // (int4: 272 inputs, three groups, the last of 16.)
          const int64_t in = int4 ? 272 : 72;
          const Graph plain = int8_linear_graph(g, dtype, in, 19, variant, false, int4);
          const Graph fused = int8_linear_graph(g2, dtype, in, 19, variant, true, int4);
          const Node& lin = fused.nodes.at(0);
          EXPECT_EQ(fused.values[linear_operand(lin, LinearOperand::kWeight)].dtype,
                    int4 ? DType::kI4 : DType::kI8);
          EXPECT_GE(linear_operand(lin, LinearOperand::kNormScale), 0);
          EXPECT_EQ(linear_operand(lin, LinearOperand::kNormRowSums) >= 0,
                    variant != Variant::kRmsNorm);
          // A LayerNorm's folded bias (made where the Linear had none) is in the input's type.
          if (variant != Variant::kRmsNorm) {
            EXPECT_EQ(fused.values[linear_operand(lin, LinearOperand::kBias)].dtype, dtype);
          }
          const Scenario sc = one_step(plain, {{"x", g.random({5, in}, lo, lo + 4.0f)}});
          const ScenarioOutputs want = run_scenario(*reference, sc);
          const ScenarioOutputs got = run_scenario(*reference, one_step(fused, sc.steps[0].feed));
          // Rows of mean 100 cost the f32 norm some bits of its mean (as the float fold test).
          expect_matches(got[0][0], want[0][0],
                         Check{CheckKind::kMaxRelative, std::max(dtype_tolerance(dtype), 1e-4)},
                         std::string(int4 ? "int4 " : "int8 ") + std::string(dtype_name(dtype)) +
                             " " + variant_name(variant) + " from " + std::to_string(lo));
        }
}

// The skinny GEMM on int8 weights past the main test's small shapes: 16 warps a block (2080
// inputs: more than 64 k-steps), several passes, two row tiles (24, 32 rows), and wide feature
// tiles looping over the grid (4224 features at 13 rows: four 8-feature tiles a block).
TEST(BackendOps, NarrowInt8WeightSkinnyTilesMatchReference) {
  const std::unique_ptr<Backend> reference = reference_backend();
  std::vector<NamedBackend> backends = available_backends();
  struct Shape2 {
    int64_t in, out;
  };
  int compared = 0;
  for (DType dtype : {DType::kF16, DType::kBF16})
    for (const Shape2 sh : {Shape2{2080, 1100}, Shape2{256, 4224}})
      for (int64_t n : {13, 24, 32})
        for (Variant variant :
             {Variant::kPlain, Variant::kBiasAct, Variant::kResidual, Variant::kWidened}) {
          Gen g(dtype, dtype, static_cast<uint32_t>(sh.out + n + 5 * static_cast<int>(variant)));
          const Graph graph = int8_linear_graph(g, dtype, sh.in, sh.out, variant);
          const Check check{CheckKind::kMaxRelative,
                            variant == Variant::kWidened ? dtype_tolerance(dtype) : 0.0};
          compared += compare_on_cuda(*reference, backends, g, graph, n, sh.in, sh.out, variant,
                                      check, case_name(dtype, variant, n, sh.in, sh.out));
        }
  if (compared == 0) GTEST_SKIP() << "no backend here runs int8 weights with fp16/bf16 inputs";
}

// The int8 GEMV's 8-row slices in the grid's y dimension (KILN_CUDA_I8_GEMV_ROWS=64): one slice
// and a partial one (13), eight (64).
TEST(BackendOps, NarrowInt8WeightGemvSlicesMatchReference) {
  const test::ScopedEnv slices("KILN_CUDA_I8_GEMV_ROWS", "64");
  const std::unique_ptr<Backend> reference = reference_backend();
  std::vector<NamedBackend> backends = available_backends();
  int compared = 0;
  for (DType dtype : {DType::kF16, DType::kBF16})
    for (int64_t n : {13, 64})
      for (Variant variant : {Variant::kPlain, Variant::kResidual, Variant::kBiasAct}) {
        Gen g(dtype, dtype, static_cast<uint32_t>(n + 3 * static_cast<int>(variant)));
        const Graph graph = int8_linear_graph(g, dtype, 1032, 70, variant);
        compared += compare_on_cuda(*reference, backends, g, graph, n, 1032, 70, variant, Check{},
                                    case_name(dtype, variant, n, 1032, 70));
      }
  if (compared == 0) GTEST_SKIP() << "no backend here runs int8 weights with fp16/bf16 inputs";
}

// table i8 [vocab, d] with per-row scales -> f32 rows (the Embedding of int8-weight plans on
// CUDA, whose Cast narrows them after), and an id past the table reported by name.
TEST(BackendOps, Int8EmbeddingMatchesReferenceAndRefusesBadIds) {
  const std::unique_ptr<Backend> reference = reference_backend();
  const int64_t vocab = 50, d = 72;
  Gen g(DType::kF32, DType::kF32, 91);
  GraphBuilder b("int8_embedding");
  Int8Weight w = int8_weight(g, vocab, d);
  const int ids = b.input("ids", DType::kI64, {kTokens});
  b.output(b.embedding_quantized(b.weight("table", std::move(w.q)), ids,
                                 b.weight("table.scales", std::move(w.scales)), "embed"),
           "y");
  const Graph graph = b.finish();
  const std::vector<int64_t> good = {0, 49, 7, 7, 23};
  const Scenario sc = one_step(graph, {{"ids", Tensor::from_vector(good, {5})}});
  const ScenarioOutputs ref = run_scenario(*reference, sc);
  int compared = 0;
  for (NamedBackend& nb : available_backends()) {
    if (!unsupported(*nb.backend, graph).empty()) continue;
    expect_matches(run_scenario(*nb.backend, sc)[0][0], ref[0][0], Check{}, nb.name);
    const std::vector<int64_t> bad = {3, 50};
    try {
      run_scenario(*nb.backend, one_step(graph, {{"ids", Tensor::from_vector(bad, {2})}}));
      ADD_FAILURE() << nb.name << " ran id 50 of a 50-row table";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("50"), std::string::npos) << nb.name << ": " << e.what();
    }
    ++compared;
  }
  EXPECT_GT(compared, 0) << "the CPU runs i8 tables too";
}

}  // namespace
}  // namespace kiln::test
