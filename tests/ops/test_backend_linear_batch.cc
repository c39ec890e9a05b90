// A Linear row's result does not depend on how many rows run with it, bitwise, below the CPU's
// GEMM threshold (64 rows: batched decode, short prompts); from it (prefill through oneDNN) it
// stays within float rounding of the row alone. DESIGN.md: a sequence's results do not depend on
// its batch where that costs little.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "../models/graph_runner.h"
#include "backend_ops.h"
#include "graph/builder.h"
#include "graph/linear.h"
#include "graph/verifier.h"
#include "passes/pass.h"

namespace kiln::test {
namespace {

TEST(BackendOps, LinearRowsDoNotDependOnTheirBatch) {
  const int64_t in = 96, out = 70;  // out: neither a multiple of 16 nor of 64
  Gen g(DType::kF32, DType::kF32, 5);
  GraphBuilder b("linear");
  const int x = b.input("x", DType::kF32, {kTokens, Dim::of(in)});
  b.output(b.linear(x, b.weight("w", g.random({out, in})), b.weight("b", g.random({out})), "fc"),
           "y");
  const Graph graph = b.finish();
  const std::vector<float> rows = g.floats(130 * in, -2, 2);
  int checked = 0;
  for (NamedBackend& nb : available_backends()) {
    if (!nb.batch_invariant) continue;
    std::unique_ptr<Executable> exe = nb.backend->compile(graph, test_profile());
    // The first n rows together; returns row `r`'s outputs.
    auto row_of = [&](int64_t n, int64_t r) {
      const std::vector<float> feed(rows.begin(), rows.begin() + n * in);
      const std::vector<Tensor> inputs = {Tensor::from_vector(feed, {n, in})};
      const Tensor& y = exe->execute(inputs, nullptr)[0];
      return std::vector<float>(y.data<float>() + r * out, y.data<float>() + (r + 1) * out);
    };
    for (int64_t r : {0, 2, 3}) {
      const std::vector<float> alone = row_of(r + 1, r);
      for (int64_t n : {4, 5, 17, 63}) {
        const std::vector<float> batched = row_of(n, r);
        EXPECT_EQ(std::memcmp(alone.data(), batched.data(), alone.size() * sizeof(float)), 0)
            << nb.name << ": row " << r << " of " << n;
      }
      for (int64_t n : {64, 130}) {
        const std::vector<float> batched = row_of(n, r);
        for (int64_t o = 0; o < out; ++o)
          EXPECT_NEAR(batched[o], alone[o], 1e-5f * (1.f + std::abs(alone[o])))
              << nb.name << ": row " << r << " of " << n << ", feature " << o;
      }
    }
    ++checked;
  }
  EXPECT_GT(checked, 0) << "the CPU backend promises batch invariance";
}

// fuse_linear_residual (CUDA plans): the residual Add after a Linear (BLOOM's attention output
// and FFN down projections) folded into the Linear gives the unfused graph's numbers on the
// reference backend and on every backend that runs it: both operand orders, with and without
// bias, one row and few (CUDA's GEMV) and many (cuBLASLt), every float dtype; and nothing is fused
// when the Linear's output is also read elsewhere (a graph output here).
TEST(BackendOps, LinearWithFusedResidualMatchesTheUnfusedGraph) {
  const int64_t in = 64, out = 48;
  const std::unique_ptr<Backend> reference = reference_backend();
  const Logger quiet(LogLevel::kSilent);
  int compared = 0;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16})
    for (int variant = 0; variant < 4; ++variant) {
      const bool bias = variant & 1, residual_first = variant & 2;
      Gen g(dtype, dtype, 11 + variant);
      GraphBuilder b("linear_residual");
      const int x = b.input("x", dtype, {kTokens, Dim::of(in)});
      const int r = b.input("r", dtype, {kTokens, Dim::of(out)});
      const int o = b.linear(x, b.weight("w", g.random({out, in})),
                             bias ? b.weight("b", g.random({out})) : -1, "fc");
      b.output(residual_first ? b.add(r, o, "residual") : b.add(o, r, "residual"), "y");
      if (variant == 3) b.output(o, "fc_out");  // read twice: the add stays a node
      const Graph plain = b.finish();
      Graph fused = plain;
      EXPECT_EQ(fuse_linear_residual(fused, quiet), variant == 3 ? 0 : 1) << variant;
      verify_graph(fused);
      // 1: the one-row GEMV (standard and wide instances); 16, 32: the skinny GEMM (cuBLASLt on
      // the cuda-block-attention backend); 70: cuBLASLt.
      for (int64_t n : {1, 3, 16, 32, 70}) {
        const std::map<std::string, Tensor> feed = {{"x", g.random({n, in}, -2, 2)},
                                                    {"r", g.random({n, out}, -2, 2)}};
        const ScenarioOutputs ref = run_scenario(*reference, one_step(plain, feed));
        std::vector<std::pair<std::string, ScenarioOutputs>> got;
        got.emplace_back("reference", run_scenario(*reference, one_step(fused, feed)));
        for (NamedBackend& nb : available_backends())
          if (unsupported(*nb.backend, fused).empty())  // the CPU runs no fused residual
            got.emplace_back(nb.name, run_scenario(*nb.backend, one_step(fused, feed)));
        for (const auto& [name, outs] : got)
          for (size_t k = 0; k < ref[0].size(); ++k) {
            expect_matches(outs[0][k], ref[0][k], Check{},
                           name + " " + std::string(dtype_name(dtype)) + " variant " +
                               std::to_string(variant) + " rows " + std::to_string(n));
            ++compared;
          }
      }
    }
  EXPECT_GT(compared, 0);
}

// fuse_norm_linear (CUDA plans): a LayerNorm or RMSNorm folded into the Linears that read it
// (weight * gamma, bias + w · beta, the weight's row sums; mean and 1 / std applied after the
// product) gives the unfused graph's numbers within the dtype's tolerance, on the reference and
// on each backend that runs it: CUDA's GEMV takes the norm itself at one row; more rows, and rows
// the GEMV cannot take, are standardized by the norm kernel first. One reader and two (T5's q,
// k, v read one norm), with and without the Linear's bias, with a fused activation (BLOOM's
// dense_h_to_4h), rows of small and of large mean (the one-row GEMV's sums must not cancel),
// rows longer than one pass of the wide one-row GEMV's loads (8256); the skinny GEMM's rows (16,
// 32, after the norm kernel; 4500 features take its widest tiles);
// a reader whose weight is shared (a tied lm_head) keeps its weight and takes gamma as its norm
// scale (x * gamma on the fly); nothing is folded when the norm's output is also read elsewhere
// (a graph output here).
TEST(BackendOps, LinearWithFoldedNormMatchesTheUnfusedGraph) {
  const std::unique_ptr<Backend> reference = reference_backend();
  const Logger quiet(LogLevel::kSilent);
  struct Shape2 {
    int64_t in, out;
  };
  int compared = 0;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16})
    for (bool layer : {true, false})
      for (const Shape2 sh :
           {Shape2{256, 37}, Shape2{2048, 64}, Shape2{100, 20}, Shape2{8256, 12}, Shape2{64, 4500}})
        for (int variant = 0; variant < 4; ++variant) {
          const bool two_readers = variant == 1, also_output = variant == 2, shared = variant == 3;
          Gen g(dtype, dtype, static_cast<uint32_t>(sh.in + variant + (layer ? 7 : 0)));
          GraphBuilder b("norm_linear");
          const int x = b.input("x", dtype, {kTokens, Dim::of(sh.in)});
          const int nw = b.weight("nw", g.random({sh.in}, 0.5f, 1.5f));
          const int y = layer ? b.layer_norm(x, nw, b.weight("nb", g.random({sh.in})), 1e-5, "ln")
                              : b.rms_norm(x, nw, 1e-6, "rms");
          const int w = b.weight("w", g.random({sh.out, sh.in}));
          b.output(b.linear(y, w, b.weight("b", g.random({sh.out})), "fc1"), "y1");
          if (two_readers)
            b.output(b.linear(y, b.weight("w2", g.random({sh.out, sh.in})), -1, "fc2"), "y2");
          if (also_output) b.output(y, "normed");
          if (shared) b.output(b.linear(x, w, -1, "same_weight"), "y3");
          Graph plain = b.finish();
          if (two_readers)
            for (Node& n : plain.nodes)
              if (n.name == "fc1")
                n.attr<LinearAttrs>().epilogue.activation = Activation::kGeluTanh;
          Graph fused = plain;
          ASSERT_EQ(fuse_norm_linear(fused, quiet), also_output ? 0 : 1) << variant;
          verify_graph(fused);
          if (also_output) continue;
          for (const Node& n : fused.nodes) {
            if (n.name != "fc1") continue;
            const bool scaled = linear_operand(n, LinearOperand::kNormScale) >= 0;
            EXPECT_EQ(scaled, shared) << variant;
            EXPECT_EQ(fused.values[n.inputs[1]].name == "w", shared) << variant;
          }
          for (int64_t n : {1, 3, 8, 16, 32, 70})
            for (const float lo : {-3.0f, 200.0f}) {
              const std::map<std::string, Tensor> feed = {
                  {"x", g.random({n, sh.in}, lo, lo < 0 ? 5.0f : lo + 4.0f)}};
              const std::string what =
                  std::string(dtype_name(dtype)) + (layer ? " layer_norm" : " rms_norm") + " [" +
                  std::to_string(n) + ", " + std::to_string(sh.in) + "] from " +
                  std::to_string(lo) + ", variant " + std::to_string(variant);
              const ScenarioOutputs ref = run_scenario(*reference, one_step(plain, feed));
              std::vector<std::pair<std::string, ScenarioOutputs>> got;
              got.emplace_back("reference", run_scenario(*reference, one_step(fused, feed)));
              for (NamedBackend& nb : available_backends()) {
                if (!unsupported(*nb.backend, fused).empty()) continue;  // the CPU: no folded norm
                got.emplace_back(nb.name, run_scenario(*nb.backend, one_step(fused, feed)));
                got.emplace_back(nb.name + " unfused",
                                 run_scenario(*nb.backend, one_step(plain, feed)));
              }
              // Rows of mean 200 cost any fp32 LayerNorm ~8 bits of its mean (the unfused CUDA
              // kernel's too): 1e-4 of max |ref| for them.
              const Check check{CheckKind::kMaxRelative,
                                lo > 0 ? std::max(dtype_tolerance(dtype), 1e-4) : 0.0};
              for (const auto& [name, outs] : got)
                for (size_t k = 0; k < ref[0].size(); ++k)
                  expect_matches(outs[0][k], ref[0][k], check, name + " " + what);
              ++compared;
            }
        }
  EXPECT_GT(compared, 0);
}

// Every CPU backend refuses `fused` by a message naming `what`, both when asked what it cannot
// run and when compiling it, instead of ignoring the fused part.
void expect_cpu_refuses(const Graph& fused, const std::string& what) {
  for (NamedBackend& nb : available_backends()) {
    if (nb.backend->device() != Device::kCpu) continue;
    EXPECT_NE(unsupported(*nb.backend, fused).find(what), std::string::npos) << nb.name;
    try {
      nb.backend->compile(fused, test_profile());
      ADD_FAILURE() << nb.name << " compiled a graph with a " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  }
}

// The CPU refuses a folded input norm instead of ignoring it.
TEST(BackendOps, BadInputCpuRefusesAFusedNorm) {
  Gen g(DType::kF32, DType::kF32, 4);
  GraphBuilder b("norm_linear");
  const int x = b.input("x", DType::kF32, {kTokens, Dim::of(8)});
  const int y = b.rms_norm(x, b.weight("nw", g.random({8})), 1e-6, "rms");
  b.output(b.linear(y, b.weight("w", g.random({4, 8})), -1, "fc"), "y");
  Graph fused = b.finish();
  ASSERT_EQ(fuse_norm_linear(fused, Logger(LogLevel::kSilent)), 1);
  expect_cpu_refuses(fused, "folded input norm");
}

// Decode-sized linears (CUDA's GEMV: up to 5 rows, up to 8 on the backend variant that forces
// it; four features per warp, warps sharing a row when features are few) against the reference:
// feature counts that are not a multiple of four, long rows split across warps, with and without
// bias and activation, every float dtype.
TEST(BackendOps, FewRowLinearsMatchReference) {
  const std::unique_ptr<Backend> reference = reference_backend();
  struct Shape2 {
    int64_t in, out;
  };
  int compared = 0;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16})
    for (const Shape2 sh : {Shape2{64, 37}, Shape2{2048, 64}, Shape2{256, 1030}, Shape2{512, 3}})
      for (int64_t n : {1, 3, 5, 6, 8}) {
        Gen g(dtype, dtype, static_cast<uint32_t>(sh.in + sh.out + n));
        GraphBuilder b("gemv");
        const int x = b.input("x", dtype, {kTokens, Dim::of(sh.in)});
        const bool extras = n == 3;
        const int y = b.linear(x, b.weight("w", g.random({sh.out, sh.in})),
                               extras ? b.weight("b", g.random({sh.out})) : -1, "fc");
        b.output(y, "y");
        Graph graph = b.finish();
        // The activation in the Linear's epilogue, as fuse_linear_activation leaves it.
        if (extras)
          graph.nodes.back().attr<LinearAttrs>().epilogue.activation = Activation::kGeluTanh;
        const Scenario sc = one_step(graph, {{"x", g.random({n, sh.in}, -2, 2)}});
        const ScenarioOutputs ref = run_scenario(*reference, sc);
        for (NamedBackend& nb : available_backends()) {
          if (!unsupported(*nb.backend, graph).empty()) continue;
          expect_matches(run_scenario(*nb.backend, sc)[0][0], ref[0][0], Check{},
                         nb.name + " " + std::string(dtype_name(dtype)) + " [" + std::to_string(n) +
                             ", " + std::to_string(sh.in) + "] x [" + std::to_string(sh.out) +
                             ", " + std::to_string(sh.in) + "]^T");
          ++compared;
        }
      }
  EXPECT_GT(compared, 0);
}

// The CPU refuses a fused residual instead of ignoring it.
TEST(BackendOps, BadInputCpuRefusesAFusedResidual) {
  Gen g(DType::kF32, DType::kF32, 3);
  GraphBuilder b("linear_residual");
  const int x = b.input("x", DType::kF32, {kTokens, Dim::of(8)});
  const int r = b.input("r", DType::kF32, {kTokens, Dim::of(4)});
  b.output(b.add(b.linear(x, b.weight("w", g.random({4, 8})), -1, "fc"), r, "residual"), "y");
  Graph fused = b.finish();
  ASSERT_EQ(fuse_linear_residual(fused, Logger(LogLevel::kSilent)), 1);
  expect_cpu_refuses(fused, "fused residual");
}

}  // namespace
}  // namespace kiln::test
