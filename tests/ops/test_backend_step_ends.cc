// The fusions at the ends of a CUDA decode step, each against its unfused graph on the
// reference, on the reference and on every backend that runs it (the CPU refuses them by name):
// - fuse_embedding_norm: an embedding gather and the LayerNorm of its rows as one LayerNorm
//   reading table[ids] itself (BLOOM's word_embeddings_layernorm). Rows of 16-byte vectors (the
//   GPU's vector kernel) and not, ids of both integer types, a repeated id; bad ids are errors,
//   never reads outside the table.
// - the decoder's end: fuse_linear_cast (a narrow Linear storing its output as f32, the logits,
//   instead of a Cast after it), alone, after ln_f folded into a Linear whose weight is shared
//   (BLOOM's tied lm_head: fuse_norm_linear's norm scale) and with fuse_gather_linear (the
//   Linear reading the rows it needs itself), on the GEMV's row counts, the skinny GEMM's and
//   cuBLASLt's; bad rows are errors.
#include <gtest/gtest.h>

#include <algorithm>

#include "backend_ops.h"
#include "graph/builder.h"
#include "graph/verifier.h"
#include "passes/pass.h"

namespace kiln::test {
namespace {

Tensor ids_of(const std::vector<int64_t>& ids, DType type) {
  const int64_t n = static_cast<int64_t>(ids.size());
  if (type == DType::kI64) return Tensor::from_vector(ids, {n});
  return Tensor::from_vector(std::vector<int32_t>(ids.begin(), ids.end()), {n});
}

// Embedding(table [vocab, d], ids) -> LayerNorm -> "y" (and the gathered rows as a second output
// when `also_output`: then nothing fuses).
Graph embedding_norm(Gen& g, int64_t vocab, int64_t d, DType id_type, bool also_output) {
  GraphBuilder b("embedding_norm");
  // Table rows: ordinary, and every third row with a large mean (the norm's cancellation).
  std::vector<float> table = g.floats(vocab * d, -2, 2);
  for (int64_t r = 0; r < vocab; r += 3)
    for (int64_t i = 0; i < d; ++i) table[r * d + i] += 40.0f;
  const int t = b.weight("table", g.tensor(table, {vocab, d}));
  const int e = b.embedding(t, b.input("ids", id_type, {kTokens}), "embed");
  const int w = b.weight("w", g.random({d}, 0.5f, 1.5f));
  b.output(b.layer_norm(e, w, b.weight("b", g.random({d})), 1e-5, "ln"), "y");
  if (also_output) b.output(e, "rows");
  return b.finish();
}

TEST(BackendOps, EmbeddingNormMatchesTheUnfusedGraph) {
  const std::unique_ptr<Backend> reference = reference_backend();
  const Logger quiet(LogLevel::kSilent);
  int compared = 0;
  for (DType dtype : {DType::kF32, DType::kF16, DType::kBF16})
    for (const int64_t d : {int64_t{1024}, int64_t{40}, int64_t{33}})
      for (DType id_type : {DType::kI64, DType::kI32}) {
        const std::string what = std::string(dtype_name(dtype)) + " d " + std::to_string(d) +
                                 " ids " + std::string(dtype_name(id_type));
        Gen g(dtype, dtype, static_cast<uint32_t>(d + (id_type == DType::kI32 ? 1 : 0)));
        Graph kept = embedding_norm(g, 50, d, id_type, true);
        EXPECT_EQ(fuse_embedding_norm(kept, quiet), 0) << what;
        Gen g2(dtype, dtype, static_cast<uint32_t>(d + (id_type == DType::kI32 ? 1 : 0)));
        const Graph plain = embedding_norm(g2, 50, d, id_type, false);
        Graph fused = plain;
        ASSERT_EQ(fuse_embedding_norm(fused, quiet), 1) << what;
        verify_graph(fused);
        ASSERT_EQ(fused.nodes.size(), 1u) << what;
        ASSERT_EQ(fused.nodes[0].inputs.size(), 4u) << what;
        const std::map<std::string, Tensor> feed = {{"ids", ids_of({0, 49, 7, 3, 7, 1}, id_type)}};
        const ScenarioOutputs ref = run_scenario(*reference, one_step(plain, feed));
        std::vector<std::pair<std::string, ScenarioOutputs>> got;
        got.emplace_back("reference", run_scenario(*reference, one_step(fused, feed)));
        for (NamedBackend& nb : available_backends()) {
          const std::string why = unsupported(*nb.backend, fused);
          if (nb.backend->device() == Device::kCpu) {
            EXPECT_NE(why.find("gathered rows"), std::string::npos) << nb.name << ": " << why;
            continue;
          }
          got.emplace_back(nb.name, run_scenario(*nb.backend, one_step(fused, feed)));
        }
        const Check check{CheckKind::kRowRelative, dtype_tolerance(dtype)};
        for (const auto& [name, outs] : got) {
          ASSERT_EQ(outs[0][0].shape(), (Shape{6, d})) << name << " " << what;
          expect_matches(outs[0][0], ref[0][0], check, name + " " + what);
        }
        ++compared;
      }
  EXPECT_EQ(compared, 18);
}

TEST(BackendOps, BadInputEmbeddingNormIdOutOfRange) {
  const Logger quiet(LogLevel::kSilent);
  for (DType id_type : {DType::kI64, DType::kI32}) {
    Gen g(DType::kF32, DType::kF32, 3);
    Graph fused = embedding_norm(g, 10, 64, id_type, false);
    ASSERT_EQ(fuse_embedding_norm(fused, quiet), 1);
    std::vector<NamedBackend> backends = available_backends();
    backends.push_back({"reference", nullptr, reference_backend()});
    for (int64_t bad : {int64_t{10}, int64_t{-1}, int64_t{1000000}}) {
      const Scenario s = one_step(fused, {{"ids", ids_of({0, bad, 2}, id_type)}});
      for (NamedBackend& nb : backends) {
        if (!unsupported(*nb.backend, fused).empty()) continue;  // the CPU refuses the node
        try {
          run_scenario(*nb.backend, s);
          ADD_FAILURE() << nb.name << " ran id " << bad;
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("token id " + std::to_string(bad) + " "),
                    std::string::npos)
              << nb.name << ": " << e.what();
        }
      }
    }
  }
}

// x [tokens, in] -> (GatherRows of "rows") -> (LayerNorm) -> Linear(w [, b]) -> Cast f32 ->
// "logits", the frontends' decoder end; with `tied` the weight is read by a second Linear of x
// too (an embedding table's other reader).
struct EndOptions {
  bool gather = false, norm = false, bias = false, tied = false;
};
Graph decoder_end(Gen& g, DType dtype, int64_t in, int64_t out, const EndOptions& e) {
  GraphBuilder b("decoder_end");
  const int x = b.input("x", dtype, {kTokens, Dim::of(in)});
  int h = x;
  if (e.gather) h = b.gather_rows(x, b.input("rows", DType::kI64, {Dim::sym("rows")}), "gather");
  if (e.norm)
    h = b.layer_norm(h, b.weight("nw", g.random({in}, 0.5f, 1.5f)), b.weight("nb", g.random({in})),
                     1e-5, "ln_f");
  const int w = b.weight("w", g.random({out, in}));
  const int y = b.linear(h, w, e.bias ? b.weight("b", g.random({out})) : -1, "lm_head");
  b.output(b.cast(y, DType::kF32, "logits_to_f32"), "logits");
  if (e.tied) b.output(b.linear(x, w, -1, "other_reader"), "other");
  return b.finish();
}

int count_op(const Graph& g, OpKind op) {
  return static_cast<int>(
      std::count_if(g.nodes.begin(), g.nodes.end(), [&](const Node& n) { return n.op == op; }));
}

// The decoder end's passes in the pipeline's order (norm, cast, gather); the fused graph has no
// LayerNorm, Cast or GatherRows left.
Graph fused_end(const Graph& plain, const EndOptions& e) {
  const Logger quiet(LogLevel::kSilent);
  Graph g = plain;
  EXPECT_EQ(fuse_norm_linear(g, quiet), e.norm ? 1 : 0);
  EXPECT_EQ(fuse_linear_cast(g, quiet), 1);
  EXPECT_EQ(fuse_gather_linear(g, quiet), e.gather ? 1 : 0);
  verify_graph(g);
  EXPECT_EQ(count_op(g, OpKind::kCast) + count_op(g, OpKind::kLayerNorm) +
                count_op(g, OpKind::kGatherRows),
            0);
  return g;
}

// Variants: 0 plain, 1 with a bias, 2 ln_f folded into a tied lm_head (norm scale), 3 the same
// reading gathered rows (BLOOM's decoder end), 4 gathered rows without a norm (gathered into
// scratch). Row counts on the GEMV (1, 3, 8: one row gathers and normalizes inside it), on the
// skinny GEMM (16: it gathers its rows itself; a folded norm standardizes them first) and on
// cuBLASLt (70).
TEST(BackendOps, DecoderEndFusionsMatchTheUnfusedGraph) {
  const std::unique_ptr<Backend> reference = reference_backend();
  const Logger quiet(LogLevel::kSilent);
  int compared = 0;
  for (DType dtype : {DType::kF16, DType::kBF16})
    for (int variant = 0; variant < 5; ++variant) {
      EndOptions e;
      e.bias = variant == 1;
      e.norm = e.tied = variant == 2 || variant == 3;
      e.gather = variant >= 3;
      const int64_t in = 256, out = variant == 0 ? 1000 : 37;
      Gen g(dtype, dtype, static_cast<uint32_t>(variant + 40));
      const Graph plain = decoder_end(g, dtype, in, out, e);
      const Graph fused = fused_end(plain, e);
      Graph kept = plain;  // the narrow output read elsewhere too: no cast fused
      for (const Node& n : plain.nodes)
        if (n.name == "lm_head") kept.outputs.push_back(n.outputs[0]);
      EXPECT_EQ(fuse_linear_cast(kept, quiet), 0);
      for (const int64_t n : {1, 3, 8, 16, 70}) {
        const std::string what = std::string(dtype_name(dtype)) + " variant " +
                                 std::to_string(variant) + " rows " + std::to_string(n);
        std::map<std::string, Tensor> feed = {{"x", g.random({n + 2, in}, -2, 2)}};
        if (e.gather) {  // every other row from the last, then the first: not in order
          std::vector<int64_t> rows;
          for (int64_t r = 0; r < n; ++r) rows.push_back((n + 1 - 2 * r + 4 * (n + 2)) % (n + 2));
          feed["rows"] = Tensor::from_vector(rows, {n});
        }
        const ScenarioOutputs ref = run_scenario(*reference, one_step(plain, feed));
        const ScenarioOutputs ref_fused = run_scenario(*reference, one_step(fused, feed));
        ASSERT_EQ(ref_fused[0][0].dtype(), DType::kF32) << what;
        ASSERT_EQ(ref_fused[0][0].shape(), ref[0][0].shape()) << what;
        // Without a norm the fused output is the unfused one, bit for bit.
        const Check exact{e.norm ? CheckKind::kMaxRelative : CheckKind::kExact,
                          e.norm ? dtype_tolerance(dtype) : 0.0};
        expect_matches(ref_fused[0][0], ref[0][0], exact, "reference " + what);
        for (NamedBackend& nb : available_backends()) {
          const std::string why = unsupported(*nb.backend, fused);
          if (nb.backend->device() == Device::kCpu) {
            EXPECT_FALSE(why.empty()) << nb.name;
            continue;
          }
          const ScenarioOutputs got = run_scenario(*nb.backend, one_step(fused, feed));
          ASSERT_EQ(got[0][0].dtype(), DType::kF32) << nb.name << " " << what;
          expect_matches(got[0][0], ref[0][0], {CheckKind::kMaxRelative, dtype_tolerance(dtype)},
                         nb.name + " " + what);
          if (!e.norm) {  // the same kernels and roundings as the nodes apart
            expect_matches(got[0][0], run_scenario(*nb.backend, one_step(plain, feed))[0][0],
                           {CheckKind::kExact}, nb.name + " against the unfused graph, " + what);
          }
        }
        ++compared;
      }
    }
  EXPECT_EQ(compared, 50);
}

// A gathered row outside x is an error on every backend that runs the fused graph, in the
// one-row GEMV (with the norm), in the skinny GEMM (16 rows, without) and in the gather before
// other kernels.
TEST(BackendOps, BadInputDecoderEndRowOutOfRange) {
  for (const bool norm : {true, false}) {
    EndOptions e;
    e.gather = true;
    e.norm = e.tied = norm;
    Gen g(DType::kF16, DType::kF16, 5);
    const Graph fused = fused_end(decoder_end(g, DType::kF16, 64, 20, e), e);
    std::vector<NamedBackend> backends = available_backends();
    backends.push_back({"reference", nullptr, reference_backend()});
    for (const int64_t bad : {int64_t{4}, int64_t{-1}}) {
      for (const int64_t n : {int64_t{1}, int64_t{3}, int64_t{16}}) {
        std::vector<int64_t> rows(static_cast<size_t>(n), 0);
        rows.back() = bad;
        const Scenario s =
            one_step(fused, {{"x", g.random({4, 64})}, {"rows", Tensor::from_vector(rows, {n})}});
        for (NamedBackend& nb : backends) {
          if (!unsupported(*nb.backend, fused).empty()) continue;  // the CPU refuses the node
          try {
            run_scenario(*nb.backend, s);
            ADD_FAILURE() << nb.name << " ran row " << bad;
          } catch (const Error& err) {
            EXPECT_NE(std::string(err.what()).find("row " + std::to_string(bad) + " "),
                      std::string::npos)
                << nb.name << ": " << err.what();
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace kiln::test
