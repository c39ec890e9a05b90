// The int4-weight Linear (graph/linear.h: i4 weights with f16 scales per output and group of 128
// inputs) on every CPU kernel family against the reference backend, which decodes each weight
// from the definition (q · scale) and sums in double. Every family quantizes the activations to
// int8 in groups of 128 (packed_linear.h: quantize_rows_to_quads) and sums exact integers, so each
// is checked against the reference on the activations quantized the same way, within f32
// summation. Shapes cover a last group shorter than 128, an input width that is not a multiple
// of 8 (the AVX-512 kernel packs and pads it itself) or of 32 (AVX2's partial last block), output
// counts below, at and past one 16-output panel, odd ones, and row counts from one (batch-1
// decode) through several row tiles (prefill). Also: a row's result does not depend on its batch,
// the two AVX-512 dot products (vpdpbusd, vpmaddubsw) give the same bits, a plan's panel16q4
// packing gives the plain weights' bits, and malformed i4 nodes are refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "../models/graph_runner.h"
#include "backend_ops.h"
#include "core/cpu_features.h"
#include "core/half.h"
#include "graph/packing.h"
#include "passes/pass.h"

namespace kiln::test {
namespace {

constexpr uint32_t kSeed = 20261206;

struct Shape4 {
  int64_t n, in, out;
  bool bias;
  std::optional<Activation> act;
};

Graph int4_graph(Gen& g, const Shape4& s) {
  GraphBuilder b("linear_int4");
  const int x = b.input("x", DType::kF32, {kTokens, Dim::of(s.in)});
  Int4Weight w = int4_weight(g, s.out, s.in);
  const int bias = s.bias ? b.weight("b", g.random({s.out})) : -1;
  int y = b.linear_quantized(x, b.weight("w", std::move(w.q)), bias,
                             b.weight("w.scales", std::move(w.scales)), "fc");
  if (s.act) y = b.activation(y, *s.act, "act");
  b.output(y, "y");
  Graph graph = b.finish();
  if (s.act) fuse_linear_activation(graph, Logger(LogLevel::kError));
  return graph;
}

Tensor rows_of(const std::vector<float>& x, int64_t first, int64_t n, int64_t in) {
  return Tensor::from_vector(
      std::vector<float>(x.begin() + first * in, x.begin() + (first + n) * in), {n, in});
}

const Shape4 kShapes[] = {
    {1, 256, 48, true, std::nullopt},            // two whole groups, three panels
    {1, 200, 37, false, std::nullopt},           // a last group of 72, a narrow last panel
    {2, 136, 17, true, Activation::kGeluTanh},   // a last group of 8
    {3, 1030, 33, true, std::nullopt},           // in % 8 = 6: packed and padded by the kernel
    {9, 384, 16, false, Activation::kRelu},      // exactly one panel, two row tiles
    {17, 130, 45, true, std::nullopt},           // in % 32 = 2 (AVX2's partial block)
    {1, 6, 1, true, std::nullopt},               // one output of six inputs
    {5, 8, 3, false, std::nullopt},              // one block
    {40, 520, 100, true, Activation::kGeluTanh}  // prompt-sized: several row tiles
};

class Int4Ops : public testing::TestWithParam<Shape4> {};

TEST_P(Int4Ops, EveryCpuFamilyMatchesReferenceOnQuantizedRows) {
  const Shape4 s = GetParam();
  Gen g(DType::kF32, DType::kF32, kSeed);
  const Graph graph = int4_graph(g, s);
  std::vector<float> x = g.floats(s.n * s.in, -2.0f, 2.0f);
  if (s.n > 2) {
    std::fill(x.begin() + s.in, x.begin() + 2 * s.in, 0.f);  // row 1: zeros (the bias alone)
    for (int64_t i = 0; i < s.in; ++i) x[2 * s.in + i] *= 1e-3f;
    x[2 * s.in + s.in / 2] = 40.f;  // row 2: one outlier among small values
  }
  const std::unique_ptr<Backend> reference = reference_backend();
  ASSERT_EQ(unsupported(*reference, graph), "");
  const Tensor xt = rows_of(x, 0, s.n, s.in);
  const Tensor want =
      run_scenario(*reference, one_step(graph, {{"x", quantize_rows_to_int8(xt)}}))[0][0];
  // Not a vacuous comparison: the unquantized rows give other numbers.
  const Tensor exact = run_scenario(*reference, one_step(graph, {{"x", xt}}))[0][0];
  int families = 0;
  for (NamedBackend& b : available_backends()) {
    if (b.backend->device() != Device::kCpu) continue;
    ASSERT_EQ(unsupported(*b.backend, graph), "") << b.name;
    const Tensor got = run_scenario(*b.backend, one_step(graph, {{"x", xt}}))[0][0];
    expect_matches(got, want, Check{CheckKind::kMaxRelative, 1e-5}, b.name);
    // Every row alone gives the bits it gives in the batch (decode and prefill alike).
    for (int64_t r = 0; r < s.n; r += std::max<int64_t>(1, s.n / 4)) {
      const Tensor one =
          run_scenario(*b.backend, one_step(graph, {{"x", rows_of(x, r, 1, s.in)}}))[0][0];
      EXPECT_EQ(std::memcmp(one.raw(), got.data<float>() + r * s.out, s.out * sizeof(float)), 0)
          << b.name << " row " << r << " alone";
    }
    ++families;
  }
  EXPECT_GE(families, 1);
  double diff = 0.0;
  for (int64_t i = 0; i < want.numel(); ++i)
    diff = std::max(diff, std::fabs(double{want.data<float>()[i]} - exact.data<float>()[i]));
  if (s.in > 8) {
    EXPECT_GT(diff, 0.0) << "the activation quantization must show";
  }
}

INSTANTIATE_TEST_SUITE_P(BackendOps, Int4Ops, testing::ValuesIn(kShapes),
                         [](const testing::TestParamInfo<Shape4>& info) {
                           const Shape4& s = info.param;
                           return fmt::format("Linear_i4_n{}_in{}_out{}_{}_{}", s.n, s.in, s.out,
                                              s.bias ? "bias" : "nobias",
                                              s.act ? activation_name(*s.act) : "noact");
                         });

// The two AVX-512 dot products (vpdpbusd with VNNI, vpmaddubsw + vpmaddwd without) sum the same
// integers and scale them alike: the same bits. And a plan's panel16q4 weights with panel16
// scales give the bits of the same weights stored plain (packed by the kernel at load).
TEST(Int4Ops, Avx512DotProductsAndPlanPackingGiveTheSameBits) {
  const CpuFeatures f = detect_cpu_features();
  if (best_cpu_isa(f) != CpuIsa::kAvx512) GTEST_SKIP() << "no AVX-512 here";
  for (const Shape4& s : {Shape4{13, 264, 70, true, Activation::kGeluTanh},
                          Shape4{1, 128, 33, false, std::nullopt}}) {
    Gen g(DType::kF32, DType::kF32, kSeed + 1);
    const Graph plain = int4_graph(g, s);
    Graph packed = plain;
    const Node& fc = packed.nodes[0];
    Value& w = packed.values[linear_operand(fc, LinearOperand::kWeight)];
    Tensor pw = Tensor::empty(DType::kI4, w.data.shape());
    pack_panel16q4(w.data.raw(), pw.raw(), s.out, s.in);
    w.data = pw;
    w.layout = panel16q4_layout();
    Value& sc = packed.values[linear_operand(fc, LinearOperand::kWeightScales)];
    Tensor ps = Tensor::empty(DType::kF16, sc.data.shape());
    pack_panel16(sc.data.raw(), ps.raw(), sc.data.dim(0), sc.data.dim(1), 2);
    sc.data = ps;
    sc.layout = panel16_layout();
    const Tensor xt = rows_of(g.floats(s.n * s.in, -2.0f, 2.0f), 0, s.n, s.in);
    std::vector<Tensor> results;
    for (bool vnni : {false, true}) {
      if (vnni && !(f.avx512_vnni && f.avx512_vbmi)) continue;
      ContextOptions options{LogLevel::kError, 2};
      options.cpu_isa = CpuIsa::kAvx512;
      options.cpu_int8_dot = vnni;
      Context ctx(options);
      const std::unique_ptr<Backend> cpu = make_cpu_backend(ctx);
      for (const Graph* graph : std::initializer_list<const Graph*>{&plain, &packed})
        results.push_back(run_scenario(*cpu, one_step(*graph, {{"x", xt}}))[0][0]);
    }
    for (size_t i = 1; i < results.size(); ++i)
      EXPECT_EQ(std::memcmp(results[i].raw(), results[0].raw(), results[0].nbytes()), 0)
          << "n=" << s.n << " result " << i
          << " (vpmaddubsw plain, packed, vpdpbusd plain, packed)";
  }
}

// i4 weights need their f16 group scales of the right shape, and an even input width.
TEST(Int4Ops, MalformedInt4NodesAreRefusedNamingTheScales) {
  Gen g(DType::kF32, DType::kF32, kSeed);
  auto refused = [&](auto&& build, const std::string& what) {
    GraphBuilder b("bad_int4");
    const int x = b.input("x", DType::kF32, {kTokens, Dim::of(200)});
    try {
      build(b, x);
      ADD_FAILURE() << what << ": accepted";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("scales"), std::string::npos)
          << what << ": " << e.what();
    }
  };
  Int4Weight w = int4_weight(g, 5, 200);
  refused([&](GraphBuilder& b, int x) { b.linear(x, b.weight("w", w.q), -1, "fc"); }, "no scales");
  refused(
      [&](GraphBuilder& b, int x) {
        b.linear_quantized(x, b.weight("w", w.q), -1, b.weight("w.scales", g.random({5})), "fc");
      },
      "per-channel f32 scales");
  refused(
      [&](GraphBuilder& b, int x) {
        b.linear_quantized(
            x, b.weight("w", w.q), -1,
            b.weight("w.scales", make_tensor(DType::kF16, g.floats(5, 0.1f, 1.f), {5, 1})), "fc");
      },
      "one group where there are two");
  GraphBuilder b("odd_int4");
  const int x = b.input("x", DType::kF32, {kTokens, Dim::of(7)});
  Tensor odd = Tensor::empty(DType::kI4, {2, 7});
  EXPECT_THROW(
      b.linear_quantized(x, b.weight("w", odd), -1,
                         b.weight("s", make_tensor(DType::kF16, {1.f, 1.f}, {2, 1})), "fc"),
      Error);
}

}  // namespace
}  // namespace kiln::test
