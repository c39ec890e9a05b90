// The dtype traits table: block-quantized types are rows like any other (sizes, names,
// conversion), and a quantized Linear carries its scales in the IR.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

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

}  // namespace
}  // namespace kiln
