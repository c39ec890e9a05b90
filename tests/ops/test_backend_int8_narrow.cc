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
#include "quant_linear_cases.h"

namespace kiln::test {
namespace {

TEST(BackendOps, NarrowInt8WeightLinearsMatchReference) {
  const std::unique_ptr<Backend> reference = reference_backend();
  std::vector<NamedBackend> backends = available_backends();
  int compared = 0;
  for (DType dtype : {DType::kF16, DType::kBF16, DType::kF32})
    for (const LinearShape sh :
         {LinearShape{64, 37}, LinearShape{4104, 70}, LinearShape{1024, 8200}, LinearShape{256, 3}})
      for (int64_t n : {1, 3, 8, 13, 64, 65, 130})
        for (Variant variant : kVariants) {
          // f32 (fp16 T5's FFN output projections) has no widened output.
          if (dtype == DType::kF32 && widens(variant)) continue;
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
          const bool widened = widens(variant) || folds_norm(variant);
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
  int compared = 0;
  for (DType dtype : {DType::kF16, DType::kBF16, DType::kF32})
    for (const LinearShape sh : {LinearShape{1024, 70}, LinearShape{4112, 37},
                                 LinearShape{2080, 100}, LinearShape{256, 4224}})
      for (int64_t n : {1, 3, 8, 13, 24, 32, 65})
        for (Variant variant : {Variant::kPlain, Variant::kBiasAct, Variant::kResidual,
                                Variant::kWidened, Variant::kGatheredWidened, Variant::kLayerNorm,
                                Variant::kRmsNorm, Variant::kLayerNormNoBias}) {
          if (dtype == DType::kF32 && widens(variant)) continue;
          if (variant != Variant::kPlain && n != 1 && n != 13 && n != 65) continue;
          Gen g(dtype, dtype,
                static_cast<uint32_t>(sh.in + 3 * sh.out + n + static_cast<int>(variant)));
          const Graph graph = int8_linear_graph(g, dtype, sh.in, sh.out, variant, true, true);
          // Past the GEMV each weight times its scale is rounded to the activations' type (and
          // a folded norm's rows standardized into it past one row).
          const bool rounded = n > 8 || widens(variant) || folds_norm(variant);
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
  int compared = 0;
  for (DType dtype : {DType::kF16, DType::kBF16})
    for (const LinearShape sh : {LinearShape{2080, 1100}, LinearShape{256, 4224}})
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
