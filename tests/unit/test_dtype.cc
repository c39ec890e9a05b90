// Quantized Linears: an i8 weight carries its per-channel scales in the IR, and the reference and
// CPU backends run it as the float Linear of the dequantized weights. (The fp8 rows of the dtype
// table: test_fp8.cc.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "../models/graph_runner.h"
#include "backend/reference/reference_backend.h"
#include "graph/builder.h"

namespace kiln {
namespace {

TEST(BadInputGraphBuilder, QuantizedLinearNeedsExactlyItsScales) {
  GraphBuilder b("g");
  const int x = b.input("x", DType::kF32, {Dim::sym("tokens"), Dim::of(32)});
  const Tensor w8 = Tensor::from_vector(std::vector<int8_t>(4 * 32, 3), {4, 32});
  const Tensor scales = Tensor::from_vector(std::vector<float>{0.5f, 1, 2, 4}, {4});
  const int w = b.weight("w8", w8);
  const int s = b.weight("w8.scales", scales);
  const int y = b.linear_quantized(x, w, -1, s, "fc");
  EXPECT_EQ(b.graph().values[y].shape, (SymShape{Dim::sym("tokens"), Dim::of(4)}));
  EXPECT_THROW(b.linear(x, w, -1, "no_scales"), Error) << "an i8 weight without scales";
  const int wf = b.weight("wf", Tensor::from_vector(std::vector<float>(4 * 32, 1.0f), {4, 32}));
  EXPECT_THROW(b.linear_quantized(x, wf, -1, s, "float_with_scales"), Error);
  const int bad = b.weight("bad.scales", Tensor::from_vector(std::vector<float>{1, 2}, {2}));
  EXPECT_THROW(b.linear_quantized(x, w, -1, bad, "short_scales"), Error);
}

// The reference backend runs quantized Linears: i8 weights times their per-channel scales, equal
// to the float Linear of the dequantized weights, and so does the CPU backend; fp8 weights have
// no CPU kernel (fp8 plans are CUDA's), and the CPU backend refuses them by name.
TEST(DType, QuantizedLinearOnTheReferenceEqualsTheDequantizedFloatLinear) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> xv(3 * 64), wf(5 * 64);
  for (float& v : xv) v = dist(rng);
  for (float& v : wf) v = dist(rng);
  std::vector<int8_t> w8(5 * 64);
  std::vector<float> scales(5), w8_deq(5 * 64);
  for (int o = 0; o < 5; ++o) {
    scales[o] = 0.01f * static_cast<float>(o + 1);
    for (int i = 0; i < 64; ++i) {
      w8[o * 64 + i] = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
      w8_deq[o * 64 + i] = static_cast<float>(w8[o * 64 + i]) * scales[o];
    }
  }
  const Tensor wq = Tensor::from_vector(wf, {5, 64}).to(DType::kF8E4M3);
  auto run = [&](Backend& be, auto&& make) {
    GraphBuilder b("q");
    const int x = b.input("x", DType::kF32, {Dim::sym("tokens"), Dim::of(64)});
    b.output(make(b, x), "y");
    const Graph g = b.finish();
    return test::run_graph(be, g, {{"x", Tensor::from_vector(xv, {3, 64})}}).at("y");
  };
  Context ctx(ContextOptions{LogLevel::kError, 1});
  auto ref = make_reference_backend(ctx);
  const Tensor a = run(*ref, [&](GraphBuilder& b, int x) {
    return b.linear_quantized(x, b.weight("w", Tensor::from_vector(w8, {5, 64})), -1,
                              b.weight("s", Tensor::from_vector(scales, {5})), "fc");
  });
  const Tensor a_ref = run(*ref, [&](GraphBuilder& b, int x) {
    return b.linear(x, b.weight("w", Tensor::from_vector(w8_deq, {5, 64})), -1, "fc");
  });
  for (int i = 0; i < 15; ++i) EXPECT_NEAR(a.data<float>()[i], a_ref.data<float>()[i], 1e-5f) << i;
  // The cpu backend's int8 Linear (int8-weight plans) gives the dequantized float Linear too: in
  // f32 FMAs to float rounding; in AVX512-VNNI int8 dot products (where the CPU has them), which
  // quantize the activations (groups of 128, steps of max|group| / 127), within that rounding.
  auto cpu_linear = [&](bool int8_dot) {
    ContextOptions o{LogLevel::kError, 1};
    o.cpu_int8_dot = int8_dot;
    Context cpu_ctx(o);
    auto cpu = make_cpu_backend(cpu_ctx);
    return run(*cpu, [&](GraphBuilder& b, int x) {
      return b.linear_quantized(x, b.weight("w", Tensor::from_vector(w8, {5, 64})), -1,
                                b.weight("s", Tensor::from_vector(scales, {5})), "fc");
    });
  };
  const Tensor c = cpu_linear(false);
  for (int i = 0; i < 15; ++i) EXPECT_NEAR(c.data<float>()[i], a_ref.data<float>()[i], 1e-5f) << i;
  if (Context(ContextOptions{LogLevel::kError, 1}).cpu_int8_dot()) {
    const Tensor d = cpu_linear(true);
    float top = 0.f;
    for (int i = 0; i < 15; ++i) top = std::max(top, std::fabs(a_ref.data<float>()[i]));
    for (int i = 0; i < 15; ++i)
      EXPECT_NEAR(d.data<float>()[i], a_ref.data<float>()[i], 0.02f * top) << i;
  }
  auto cpu = make_cpu_backend(ctx);
  // fp8 weights (with their per-channel scales: fp8 plans run on CUDA) have no cpu kernel:
  // refused at compile time, naming the dtype.
  GraphBuilder b("q");
  const int x = b.input("x", DType::kF32, {Dim::sym("tokens"), Dim::of(64)});
  b.output(b.linear_quantized(x, b.weight("w", wq), -1,
                              b.weight("s", Tensor::from_vector(scales, {5})), "fc"),
           "y");
  const Graph g = b.finish();
  try {
    cpu->compile(g, test::test_profile());
    ADD_FAILURE() << "the cpu backend has no f8_e4m3 Linear";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f8_e4m3 weights"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln
