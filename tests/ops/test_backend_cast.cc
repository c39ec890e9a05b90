// Casts from f32 to f16 and bf16 on every backend, the reference included, against
// hand-checked encodings and the rounding computed from the value in double
// (tests/ops/f16_reference.h): ties to even, overflow, subnormals, NaN; the way back is exact.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

#include "backend_ops.h"
#include "f16_reference.h"

namespace kiln::test {
namespace {

constexpr uint32_t kSeed = 20240611;  // the op table's

// Cast to f16 against hand-checked encodings and the rounding computed from the value in double
// (tests/ops/f16_reference.h); the way back must give exactly the f16 value.
TEST(BackendOps, CastF32ToF16RoundsToNearestEven) {
  struct Case {
    float value;
    uint16_t bits;
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // clang-format off
  const Case cases[] = {
      {1.0f, 0x3c00},                        {-2.0f, 0xc000},
      {1.0f + 0x1p-11f, 0x3c00},             // tie, rounds to even (down)
      {1.0f + 3 * 0x1p-11f, 0x3c02},         // tie, rounds to even (up)
      {1.0f + 0x1p-11f + 0x1p-20f, 0x3c01},  // just above the tie
      {-0.0f, 0x8000},                       {0.1f, 0x2e66},
      {65504.0f, 0x7bff},                    {65519.0f, 0x7bff},  // largest finite
      {65520.0f, 0x7c00},                    // tie between 65504 and 2^16 rounds to infinity
      {1e9f, 0x7c00},                        {-std::numeric_limits<float>::infinity(), 0xfc00},
      {0x1p-14f, 0x0400},                    // smallest normal
      {0x1p-14f - 0x1p-25f, 0x0400},         // tie: largest subnormal / smallest normal
      {0x1p-24f, 0x0001},                    // smallest subnormal
      {0x1p-25f, 0x0000},                    // tie with zero rounds to even (zero)
      {3 * 0x1p-25f, 0x0002},                // tie between 1 and 2 ulps rounds to 2
      {0x1p-26f, 0x0000},                    {nan, 0x7e00},
  };
  // clang-format on
  std::mt19937 rng(kSeed);
  std::vector<float> x;
  for (const Case& c : cases) {
    x.push_back(c.value);
    ASSERT_EQ(f16_bits(c.value), c.bits) << "the test's own rounding disagrees at " << c.value;
  }
  std::uniform_real_distribution<float> wide(-70000.0f, 70000.0f), tiny(-1e-4f, 1e-4f);
  for (int i = 0; i < 64; ++i) x.push_back(wide(rng));
  for (int i = 0; i < 64; ++i) x.push_back(tiny(rng));  // the subnormal range
  const int64_t n = static_cast<int64_t>(x.size());
  GraphBuilder b("cast16");
  const int h = b.cast(b.input("x", DType::kF32, {kTokens}), DType::kF16, "to_f16");
  b.output(h, "half");
  b.output(b.cast(h, DType::kF32, "to_f32"), "back");
  const Scenario s = one_step(b.finish(), {{"x", Tensor::from_vector(x, {n})}});
  for (NamedBackend& backend : every_backend()) {
    const ScenarioOutputs out = run_scenario(*backend.backend, s);
    ASSERT_EQ(out[0][0].dtype(), DType::kF16);
    const auto* bits = static_cast<const uint16_t*>(out[0][0].raw());
    const float* back = out[0][1].data<float>();
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t want = f16_bits(x[i]);
      if (std::isnan(x[i])) {
        EXPECT_TRUE(std::isnan(f16_value(bits[i]))) << backend.name << " " << i;
        EXPECT_TRUE(std::isnan(back[i])) << backend.name << " " << i;
        continue;
      }
      EXPECT_EQ(bits[i], want) << backend.name << ": f16 of " << x[i] << " (0x" << std::hex
                               << std::bit_cast<uint32_t>(x[i]) << ")";
      EXPECT_EQ(static_cast<double>(back[i]), f16_value(want)) << backend.name << " " << x[i];
    }
  }
}

TEST(BackendOps, CastF32ToBf16RoundsToNearestEven) {
  struct Case {
    uint32_t f32_bits;
    uint16_t bf16_bits;
  };
  // clang-format off
  const Case cases[] = {
      {0x3f800000, 0x3f80}, {0x80000000, 0x8000},  // 1.0, -0.0
      {0x3f808000, 0x3f80},  // tie, even stays
      {0x3f818000, 0x3f82},  // tie, odd rounds up
      {0x3f808001, 0x3f81},  // above the tie
      {0x3f807fff, 0x3f80},  // below the tie
      {0xbf818000, 0xbf82},  // negative tie
      {0x7f7e8000, 0x7f7e},  // tie near the top, even
      {0x7f7f8000, 0x7f80},  // tie at the top rounds to infinity
      {0x7f7fffff, 0x7f80}, {0xff7fffff, 0xff80},  // +-FLT_MAX round to infinity
      {0x00018000, 0x0002},  // subnormal tie, odd rounds up
      {0x80008000, 0x8000},  // negative subnormal tie to (negative) zero
      {0x00000001, 0x0000}, {0xff800000, 0xff80},  // smallest subnormal, -inf
  };
  // clang-format on
  std::vector<float> x;
  for (const Case& c : cases) {
    x.push_back(std::bit_cast<float>(c.f32_bits));
    ASSERT_EQ(bf16_bits(x.back()), c.bf16_bits)
        << "the test's own rounding disagrees at 0x" << std::hex << c.f32_bits;
  }
  x.push_back(std::bit_cast<float>(0x7fc00000u));  // quiet NaN
  x.push_back(std::bit_cast<float>(0x7f800001u));  // signalling NaN must stay a NaN
  const int64_t n = static_cast<int64_t>(x.size());
  GraphBuilder b("cast_bf16");
  const int h = b.cast(b.input("x", DType::kF32, {kTokens}), DType::kBF16, "to_bf16");
  b.output(h, "bf16");
  b.output(b.cast(h, DType::kF32, "to_f32"), "back");
  const Scenario s = one_step(b.finish(), {{"x", Tensor::from_vector(x, {n})}});
  for (NamedBackend& backend : every_backend()) {
    const ScenarioOutputs out = run_scenario(*backend.backend, s);
    const auto* bits = static_cast<const uint16_t*>(out[0][0].raw());
    const float* back = out[0][1].data<float>();
    for (size_t i = 0; i < std::size(cases); ++i) {
      EXPECT_EQ(bits[i], cases[i].bf16_bits)
          << backend.name << std::hex << " 0x" << cases[i].f32_bits;
      EXPECT_EQ(std::bit_cast<uint32_t>(back[i]), static_cast<uint32_t>(cases[i].bf16_bits) << 16)
          << backend.name << std::hex << " 0x" << cases[i].f32_bits;
    }
    for (int64_t i = static_cast<int64_t>(std::size(cases)); i < n; ++i) {
      EXPECT_TRUE(std::isnan(bf16_value(bits[i]))) << backend.name << ": NaN lost at " << i;
      EXPECT_TRUE(std::isnan(back[i])) << backend.name << " " << i;
    }
  }
}

}  // namespace
}  // namespace kiln::test
