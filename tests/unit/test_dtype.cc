// The dtype traits table: block-quantized types are rows like any other (sizes, names,
// conversion), and a quantized Linear carries its scales in the IR.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "../models/graph_runner.h"
#include "backend/reference/reference_backend.h"
#include "graph/builder.h"

namespace kiln {
namespace {

TEST(DType, Q8B32BlocksAre34BytesPer32Values) {
  const DTypeTraits& t = dtype_traits(DType::kQ8B32);
  EXPECT_EQ(t.block_elems, 32);
  EXPECT_EQ(t.block_bytes, 34);
  EXPECT_EQ(dtype_bytes(DType::kQ8B32, 64), 68u);
  EXPECT_THROW(dtype_bytes(DType::kQ8B32, 33), Error) << "not a whole number of blocks";
  EXPECT_EQ(parse_dtype("q8_b32"), DType::kQ8B32);
  DType d;
  EXPECT_FALSE(try_parse_safetensors_dtype("", &d)) << "kiln-only types have no safetensors name";
}

// Symmetric per-block quantization, checked from the definition: every value is within half a
// step (scale / 2) of the original, the block maximum maps to ±127, and zeros stay zero.
TEST(DType, Q8B32RoundTripIsWithinHalfAStepPerBlock) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-3.0f, 3.0f);
  std::vector<float> x(96);
  for (float& v : x) v = dist(rng);
  for (int i = 64; i < 96; ++i) x[i] = 0.0f;  // an all-zero block
  const Tensor q = Tensor::from_vector(x, {3, 32}).to(DType::kQ8B32);
  EXPECT_EQ(q.nbytes(), 3u * 34u);
  const Tensor back = q.to_f32();
  for (int b = 0; b < 3; ++b) {
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[b * 32 + i]));
    const float step = amax / 127.0f;
    for (int i = 0; i < 32; ++i) {
      const float got = back.data<float>()[b * 32 + i];
      EXPECT_LE(std::fabs(got - x[b * 32 + i]), step * 0.5f * 1.002f + 1e-7f)
          << "block " << b << " [" << i << "]";
    }
  }
  for (int i = 64; i < 96; ++i) EXPECT_EQ(back.data<float>()[i], 0.0f);
}

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
  // Block-quantized weights hold their scales inside the blocks.
  const int wq = b.weight(
      "wq", Tensor::from_vector(std::vector<float>(4 * 32, 0.25f), {4, 32}).to(DType::kQ8B32));
  EXPECT_NO_THROW(b.linear(x, wq, -1, "blocks"));
}

// The reference backend runs quantized Linears: i8 weights times their per-channel scales, and
// q8_b32 blocks decoded with their own scales, equal to the float Linear of the dequantized
// weights; the CPU backend refuses them by name (no int8 kernels yet).
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
  const Tensor wq = Tensor::from_vector(wf, {5, 64}).to(DType::kQ8B32);
  const Tensor wq_deq = wq.to_f32();
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
  const Tensor q =
      run(*ref, [&](GraphBuilder& b, int x) { return b.linear(x, b.weight("w", wq), -1, "fc"); });
  const Tensor q_ref = run(
      *ref, [&](GraphBuilder& b, int x) { return b.linear(x, b.weight("w", wq_deq), -1, "fc"); });
  for (int i = 0; i < 15; ++i) {
    EXPECT_NEAR(a.data<float>()[i], a_ref.data<float>()[i], 1e-5f) << i;
    EXPECT_NEAR(q.data<float>()[i], q_ref.data<float>()[i], 1e-5f) << i;
  }
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
  // Block-quantized weights have no cpu kernel: refused at compile time, naming the dtype.
  GraphBuilder b("q");
  const int x = b.input("x", DType::kF32, {Dim::sym("tokens"), Dim::of(64)});
  b.output(b.linear(x, b.weight("w", wq), -1, "fc"), "y");
  const Graph g = b.finish();
  try {
    cpu->compile(g, test::test_profile());
    ADD_FAILURE() << "the cpu backend has no q8_b32 Linear";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q8_b32 weights"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace kiln
