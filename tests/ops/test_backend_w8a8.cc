// W8A8 Linears (graph/linear.h: an input scale): the input quantized to int8 with one static
// scale, i8 weights with per-channel scales, integer sums, dequantized in the epilogue. Every CPU
// kernel family (AVX2 vpmaddwd, AVX512-VNNI vpdpbusd, and the AVX-512 f32-FMA fallback) against
// the reference backend on shapes with tails and odd sizes, values that clip; the quantization
// against values worked out by hand from the definition; batch invariance; the two integer
// families bit for bit; malformed nodes and scales refused.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "backend_ops.h"
#include "graph/verifier.h"
#include "passes/pass.h"

namespace kiln::test {
namespace {

constexpr uint32_t kSeed = 20250407;

const Logger& quiet() {
  static const Logger log(LogLevel::kSilent);
  return log;
}

// Gives the graph's Linear an input scale `scale` (a weight [1] of its own).
void add_input_scale(Graph& g, float scale) {
  for (Node& n : g.nodes)
    if (n.op == OpKind::kLinear) {
      const int id =
          g.add_weight(n.name + ".input_scale", Tensor::from_vector<float>({scale}, {1}));
      set_linear_operand(n, LinearOperand::kInputScale, id);
      return;
    }
  FAIL() << "no Linear in graph " << g.name;
}

struct W8a8Shape {
  int64_t n, in, out;
  bool bias;
  std::optional<Activation> act;
};

// y = act(s · q(x) · (w · scales)^T + bias) with random i8 weights over the whole range (both
// ends included) and positive per-channel scales.
Graph w8a8_graph(uint32_t seed, const W8a8Shape& s, float input_scale) {
  Gen g(DType::kF32, DType::kF32, seed);
  GraphBuilder b("w8a8");
  const int x = b.input("x", DType::kF32, {kTokens, Dim::of(s.in)});
  const std::vector<float> v = g.floats(s.out * s.in, -1.0f, 1.0f);
  std::vector<int8_t> q(v.size());
  for (size_t i = 0; i < v.size(); ++i) q[i] = static_cast<int8_t>(std::lround(v[i] * 127.0f));
  q[0] = 127;
  q[q.size() - 1] = -127;
  const int w = b.weight("w", Tensor::from_vector(q, {s.out, s.in}));
  const int scales =
      b.weight("w.scales", Tensor::from_vector(g.floats(s.out, 0.001f, 0.05f), {s.out}));
  const int bias = s.bias ? b.weight("b", g.random({s.out})) : -1;
  int y = b.linear_quantized(x, w, bias, scales, "fc");
  if (s.act) y = b.activation(y, *s.act, "act");
  b.output(y, "y");
  Graph graph = b.finish();
  if (s.act) fuse_linear_activation(graph, quiet());
  add_input_scale(graph, input_scale);
  verify_graph(graph);
  return graph;
}

// Inputs in [-2, 2) and a scale of 1.5 / 127: values past 1.5 clip to ±127.
constexpr float kClippingScale = 1.5f / 127.0f;

std::vector<W8a8Shape> shapes() {
  return {
      {1, 64, 16, true, std::nullopt},
      {3, 19, 37, false, std::nullopt},
      {7, 19, 37, true, Activation::kGeluTanh},
      {17, 1031, 45, true, std::nullopt},  // k not a multiple of 4: a partial last quad
      {33, 200, 70, true, Activation::kRelu},
      {1, 1030, 5, false, std::nullopt},  // one narrow panel only
      {5, 7, 3, true, std::nullopt},
      {70, 37, 70, true, Activation::kGeluTanh},  // prompt-sized: several row tiles
      {9, 4100, 21, false, std::nullopt},         // the AVX2 tiles' 64-bit flushes
      {40, 768, 96, false, std::nullopt},
      {2, 33001, 17, true, std::nullopt},  // past one VNNI group of 32768: two f32 conversions
  };
}

std::string shape_name(const W8a8Shape& s) {
  return fmt::format("n={} in={} out={} {} {}", s.n, s.in, s.out, s.bias ? "bias" : "nobias",
                     s.act ? activation_name(*s.act) : "noact");
}

TEST(W8a8Ops, EveryCpuFamilyMatchesTheReference) {
  const std::unique_ptr<Backend> reference = reference_backend();
  std::vector<NamedBackend> backends = available_backends();
  int checked = 0;
  for (const W8a8Shape& s : shapes()) {
    const Graph graph = w8a8_graph(kSeed, s, kClippingScale);
    Gen g(DType::kF32, DType::kF32, kSeed + 1);
    const Scenario scenario = one_step(graph, {{"x", g.random({s.n, s.in}, -2.0f, 2.0f)}});
    ASSERT_EQ(unsupported(*reference, graph), "");
    const Tensor want = run_scenario(*reference, scenario)[0][0];
    for (NamedBackend& b : backends) {
      if (b.backend->device() != Device::kCpu) continue;
      ASSERT_EQ(unsupported(*b.backend, graph), "") << b.name;
      // The quantization is the definition's on every family; only the f32 roundings of the
      // dequantization (and the fallback's f32 sums) differ from the double reference.
      expect_matches(run_scenario(*b.backend, scenario)[0][0], want,
                     Check{CheckKind::kMaxRelative, 1e-5}, b.name + " " + shape_name(s));
      ++checked;
    }
  }
  EXPECT_GE(checked, static_cast<int>(shapes().size()) * 2);
}

// The quantization by the definition (graph/linear.h), values worked out by hand: x · (1 / s)
// rounded to the nearest integer, ties to even, clamped to ±127, a NaN taken as 0. Weights pick
// one input each (w[o][i] = 1 where i = o, scale 1), so y[o] = s · q(x[o]) exactly.
TEST(W8a8Ops, QuantizeByTheDefinition) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Level {
    float x, q;
  };
  // Scale 1: x itself is rounded.
  const std::vector<Level> at_one = {
      {2.5f, 2.f},     {3.5f, 4.f},    {-2.5f, -2.f},      {0.5f, 0.f},
      {1.5f, 2.f},     {-0.5f, 0.f},   {0.49999997f, 0.f}, {126.5f, 126.f},
      {127.5f, 127.f}, {300.f, 127.f}, {-1e30f, -127.f},   {inf, 127.f},
      {-inf, -127.f},  {nan, 0.f},     {-126.6f, -127.f},  {7.f, 7.f}};
  // Scale 0.5 (inverse 2): 1.25 -> 2.5 -> 2, so y = 2 · 0.5 = 1.
  const std::vector<Level> at_half = {{1.25f, 2.f}, {1.75f, 4.f}, {-0.75f, -2.f}, {64.f, 127.f}};
  const std::unique_ptr<Backend> reference = reference_backend();
  std::vector<NamedBackend> backends = available_backends();
  for (const auto& [scale, levels] : {std::pair{1.0f, at_one}, std::pair{0.5f, at_half}}) {
    const int64_t k = static_cast<int64_t>(levels.size());
    GraphBuilder b("levels");
    const int x = b.input("x", DType::kF32, {kTokens, Dim::of(k)});
    std::vector<int8_t> eye(static_cast<size_t>(k * k), 0);
    for (int64_t i = 0; i < k; ++i) eye[i * k + i] = 1;
    b.output(b.linear_quantized(x, b.weight("w", Tensor::from_vector(eye, {k, k})), -1,
                                b.weight("s", Tensor::from_vector(std::vector<float>(k, 1.f), {k})),
                                "fc"),
             "y");
    Graph graph = b.finish();
    add_input_scale(graph, scale);
    std::vector<float> xs;
    for (const Level& l : levels) xs.push_back(l.x);
    // Two rows (the second reversed), so that tiles of several rows see them too.
    std::vector<float> two = xs;
    two.insert(two.end(), xs.rbegin(), xs.rend());
    const Scenario scenario = one_step(graph, {{"x", Tensor::from_vector(two, {2, k})}});
    std::vector<NamedBackend> all = every_backend();
    for (NamedBackend& be : all) {
      if (be.backend->device() != Device::kCpu) continue;
      const Tensor y = run_scenario(*be.backend, scenario)[0][0];
      for (int64_t i = 0; i < k; ++i) {
        EXPECT_EQ(y.data<float>()[i], levels[i].q * scale)
            << be.name << " scale " << scale << " x=" << levels[i].x;
        EXPECT_EQ(y.data<float>()[k + k - 1 - i], levels[i].q * scale)
            << be.name << " scale " << scale << " x=" << levels[i].x << " (second row)";
      }
    }
  }
}

// fp8 plans' input quantization by its definition (graph/linear.h: quantize_input_fp8), values
// worked out by hand from E4M3's grid: x · (1 / s) rounded to the nearest E4M3 value, ties to
// the even significand, saturating at ±448 (infinities too), a NaN taken as 0, subnormals down
// to 2^-9. E4M3 identity weights (code 0x38 = 1.0, scale 1): y[o] = s · q(x[o]) exactly, on the
// reference backend (the GPU's kernels are compared with it: test_backend_w8a8_cuda.cc).
TEST(Fp8Input, QuantizeByTheDefinition) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Level {
    float x, q;
  };
  const std::vector<Level> at_one = {
      {0.3f, 0.3125f},  // between 0.28125 and 0.3125 (a step of 2^-5 in [0.25, 0.5))
      {17.f, 16.f},     // the tie of 16 and 18 goes to 16 (even significand)
      {19.f, 20.f},     // the tie of 18 and 20 goes to 20
      {1.0625f, 1.f},
      {-2.75f, -2.75f},
      {464.f, 448.f},  // halfway past 448: saturates
      {500.f, 448.f},
      {1e30f, 448.f},
      {inf, 448.f},
      {-inf, -448.f},
      {nan, 0.f},
      {0.0009765625f, 0.f},          // half of 2^-9 ties to 0
      {0.0029296875f, 0.00390625f},  // 1.5 · 2^-9 ties to 2 · 2^-9
  };
  const std::vector<Level> at_half = {{0.15f, 0.3125f}, {300.f, 448.f}, {-8.5f, -16.f}};
  const std::unique_ptr<Backend> reference = reference_backend();
  for (const auto& [scale, levels] : {std::pair{1.0f, at_one}, std::pair{0.5f, at_half}}) {
    const int64_t k = static_cast<int64_t>(levels.size());
    GraphBuilder b("fp8_levels");
    const int x = b.input("x", DType::kF32, {kTokens, Dim::of(k)});
    Tensor eye = Tensor::empty(DType::kF8E4M3, {k, k});
    auto* codes = static_cast<uint8_t*>(eye.raw());
    for (int64_t i = 0; i < k * k; ++i) codes[i] = i % (k + 1) == 0 ? 0x38 : 0x00;
    b.output(b.linear_quantized(x, b.weight("w", std::move(eye)), -1,
                                b.weight("s", Tensor::from_vector(std::vector<float>(k, 1.f), {k})),
                                "fc"),
             "y");
    Graph graph = b.finish();
    add_input_scale(graph, scale);
    verify_graph(graph);
    std::vector<float> xs;
    for (const Level& l : levels) xs.push_back(l.x);
    const Tensor y =
        run_scenario(*reference, one_step(graph, {{"x", Tensor::from_vector(xs, {1, k})}}))[0][0];
    for (int64_t i = 0; i < k; ++i)
      EXPECT_EQ(y.data<float>()[i], levels[i].q * scale)
          << "scale " << scale << " x=" << levels[i].x;
  }
}

// A scale of 0 (a tensor that was always 0 during calibration): every level is 0, the outputs
// are the bias alone.
TEST(W8a8Ops, AZeroScaleGivesTheBias) {
  const W8a8Shape s{4, 37, 21, true, std::nullopt};
  const Graph graph = w8a8_graph(kSeed, s, 0.0f);
  Gen g(DType::kF32, DType::kF32, kSeed + 2);
  const Scenario scenario = one_step(graph, {{"x", g.random({s.n, s.in}, -2.0f, 2.0f)}});
  const Tensor& bias = graph.values[linear_operand(graph.nodes[0], LinearOperand::kBias)].data;
  for (NamedBackend& b : every_backend()) {
    if (b.backend->device() != Device::kCpu) continue;
    const Tensor y = run_scenario(*b.backend, scenario)[0][0];
    for (int64_t t = 0; t < s.n; ++t)
      for (int64_t o = 0; o < s.out; ++o)
        EXPECT_EQ(y.data<float>()[t * s.out + o], bias.data<float>()[o]) << b.name;
  }
}

// Each row alone, and in every batch size, gives the bits of the full batch, on every CPU family
// (static scales: a row's levels depend on that row alone; a single row takes the same integer
// path as many).
TEST(W8a8Ops, RowResultsDoNotDependOnTheBatch) {
  for (const W8a8Shape& s :
       {W8a8Shape{40, 300, 45, true, Activation::kGeluTanh}, W8a8Shape{11, 1031, 70, false, {}}}) {
    const Graph graph = w8a8_graph(kSeed, s, kClippingScale);
    Gen g(DType::kF32, DType::kF32, kSeed + 3);
    const std::vector<float> x = g.floats(s.n * s.in, -2.0f, 2.0f);
    for (NamedBackend& b : available_backends()) {
      if (!b.batch_invariant) continue;
      const Tensor all = run_scenario(
          *b.backend, one_step(graph, {{"x", Tensor::from_vector(x, {s.n, s.in})}}))[0][0];
      for (int64_t r = 0; r < s.n; r += r < 10 ? 1 : 7)
        for (int64_t n : {int64_t{1}, int64_t{2}, int64_t{9}, s.n - r}) {
          if (r + n > s.n) continue;
          const Tensor part = run_scenario(
              *b.backend,
              one_step(graph,
                       {{"x", Tensor::from_vector(std::vector<float>(x.begin() + r * s.in,
                                                                     x.begin() + (r + n) * s.in),
                                                  {n, s.in})}}))[0][0];
          ASSERT_EQ(std::memcmp(part.data<float>(), all.data<float>() + r * s.out,
                                static_cast<size_t>(n * s.out) * sizeof(float)),
                    0)
              << b.name << " " << shape_name(s) << ": rows " << r << ".." << r + n;
        }
    }
  }
}

// The AVX2 (vpmaddwd) and AVX512-VNNI (vpdpbusd) families both sum the integer products exactly
// and dequantize the same way (f32(Σ) · s · scale[o], each product rounded to f32): on rows of up
// to 32768 elements (one VNNI group), without a bias (whose add the compiler may fuse with the
// scale's multiply in one family and not the other) or an activation (whose vector maths differ
// in the last bits), their outputs are the same bits.
TEST(W8a8Ops, TheIntegerFamiliesAgreeBitForBit) {
  std::vector<NamedBackend> backends = available_backends();
  const auto avx2 = std::find_if(backends.begin(), backends.end(),
                                 [](const NamedBackend& b) { return b.name == "cpu-avx2"; });
  const auto vnni = std::find_if(backends.begin(), backends.end(),
                                 [](const NamedBackend& b) { return b.name == kInt8DotBackend; });
  ASSERT_NE(avx2, backends.end());
  if (vnni == backends.end()) GTEST_SKIP() << "no AVX512-VNNI and AVX512-VBMI here";
  for (const W8a8Shape& s : shapes()) {
    if (s.act || s.bias || s.in > 32768) continue;
    const Graph graph = w8a8_graph(kSeed, s, kClippingScale);
    Gen g(DType::kF32, DType::kF32, kSeed + 4);
    const Scenario scenario = one_step(graph, {{"x", g.random({s.n, s.in}, -2.0f, 2.0f)}});
    const Tensor a = run_scenario(*avx2->backend, scenario)[0][0];
    const Tensor b = run_scenario(*vnni->backend, scenario)[0][0];
    EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0) << shape_name(s);
  }
}

// Malformed W8A8 nodes are refused when the graph is checked, naming the problem: an input scale
// on a float weight, one of the wrong shape or type, one beside a folded norm.
TEST(W8a8BadInput, MalformedNodesAreRefused) {
  auto expect_refused = [](Graph g, const std::string& what) {
    try {
      verify_graph(g);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  {
    Gen g(DType::kF32, DType::kF32, kSeed);
    GraphBuilder b("float_weight");
    const int x = b.input("x", DType::kF32, {kTokens, Dim::of(8)});
    b.output(b.linear(x, b.weight("w", g.random({4, 8})), -1, "fc"), "y");
    Graph graph = b.finish();
    add_input_scale(graph, 0.1f);
    expect_refused(std::move(graph), "needs an i8 or f8_e4m3 weight");
  }
  {
    Graph graph = w8a8_graph(kSeed, {2, 8, 4, false, {}}, 0.1f);
    const int wide = graph.add_weight("two", Tensor::from_vector<float>({0.1f, 0.2f}, {2}));
    set_linear_operand(graph.nodes[0], LinearOperand::kInputScale, wide);
    expect_refused(std::move(graph), "two");
  }
  {
    Graph graph = w8a8_graph(kSeed, {2, 8, 4, false, {}}, 0.1f);
    graph.nodes[0].attr<LinearAttrs>().epilogue.norm = InputNorm::kRmsNorm;
    expect_refused(std::move(graph), "folded norm");
  }
}

// A scale that is negative or not finite (a hand-edited plan) is refused when the node runs,
// naming it, on every CPU family and the reference.
TEST(W8a8BadInput, BadScalesAreRefusedWhenRun) {
  for (float bad :
       {-0.5f, std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()}) {
    const Graph graph = w8a8_graph(kSeed, {3, 40, 20, true, {}}, bad);
    Gen g(DType::kF32, DType::kF32, kSeed);
    const Scenario scenario = one_step(graph, {{"x", g.random({3, 40})}});
    for (NamedBackend& b : every_backend()) {
      if (b.backend->device() != Device::kCpu) continue;
      try {
        run_scenario(*b.backend, scenario);
        ADD_FAILURE() << b.name << " ran an input scale of " << bad;
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("input scale"), std::string::npos)
            << b.name << ": " << e.what();
      }
    }
  }
}

}  // namespace
}  // namespace kiln::test
