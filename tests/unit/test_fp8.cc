// OCP's 8-bit floats (core/fp8.h, the dtype table's f8_e4m3 and f8_e5m2 rows, and the reference
// backend's own conversions) against the OCP OFP8 specification's definitions, written out here:
// every one of the 256 codes decoded, and encoding at the boundaries (the largest finite, the
// smallest subnormal, every halfway point, NaN, the infinities, -0) and on random floats, with
// the expected code found by the spec's rounding rule over the spec's values, never from kiln's
// own conversions.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "backend/reference/kernels.h"
#include "core/fp8.h"
#include "core/tensor.h"

namespace kiln {
namespace {

// A format as the spec defines it: sign, exponent and mantissa fields, the bias, and which codes
// are special.
struct Ofp8 {
  const char* name;
  DType dtype;
  int exp_bits;
  int mant_bits;
  int bias;
  bool has_inf;  // E5M2: S.11111.00 is ±inf, S.11111.xx NaN; E4M3: only S.1111.111 is NaN
};
constexpr Ofp8 kE4M3{"E4M3", DType::kF8E4M3, 4, 3, 7, false};
constexpr Ofp8 kE5M2{"E5M2", DType::kF8E5M2, 5, 2, 15, true};

// The value of `code` from the spec: (-1)^S * 2^(E - bias) * (1 + M / 2^m) for normal numbers,
// (-1)^S * 2^(1 - bias) * (M / 2^m) for E = 0, and the special codes of the format.
double spec_value(const Ofp8& f, uint8_t code) {
  const double sign = (code & 0x80) ? -1.0 : 1.0;
  const int e = (code >> f.mant_bits) & ((1 << f.exp_bits) - 1);
  const int m = code & ((1 << f.mant_bits) - 1);
  const int e_max = (1 << f.exp_bits) - 1, m_max = (1 << f.mant_bits) - 1;
  if (f.has_inf && e == e_max)
    return m == 0 ? sign * std::numeric_limits<double>::infinity()
                  : std::numeric_limits<double>::quiet_NaN();
  if (!f.has_inf && e == e_max && m == m_max) return std::numeric_limits<double>::quiet_NaN();
  const double frac = static_cast<double>(m) / (1 << f.mant_bits);
  if (e == 0) return sign * std::ldexp(frac, 1 - f.bias);
  return sign * std::ldexp(1.0 + frac, e - f.bias);
}

// The largest finite magnitude's code: E4M3 0x7E (S.1111.110), E5M2 0x7B (S.11110.11).
uint8_t max_finite_code(const Ofp8& f) { return f.has_inf ? 0x7b : 0x7e; }

// The code the spec's round-to-nearest-even gives x, with kiln's overflow rule per format (E4M3
// saturates to ±max finite, OFP8's saturation mode; E5M2 rounds past it to ±inf, the
// non-saturating mode: IEEE's rounding, where a magnitude from halfway between the largest
// finite and 2^(e_max + 1) up rounds into the next binade, which is infinity). Non-negative
// finite codes 0..max increase with their values, so x lies between two neighbours.
uint8_t spec_encode(const Ofp8& f, float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  if (std::isnan(x)) return sign | (f.has_inf ? 0x7e : 0x7f);  // NaN codes are checked by value
  const double a = std::fabs(static_cast<double>(x));
  const uint8_t top = max_finite_code(f);
  const double max = spec_value(f, top);
  if (f.has_inf) {
    const double next_binade = std::ldexp(1.0, (1 << f.exp_bits) - 1 - f.bias);
    if (a >= (max + next_binade) / 2) return sign | 0x7c;  // ±inf
  }
  if (a >= max) return sign | top;
  uint8_t lo = 0;
  while (spec_value(f, static_cast<uint8_t>(lo + 1)) <= a) ++lo;
  if (spec_value(f, lo) == a) return sign | lo;
  const auto hi = static_cast<uint8_t>(lo + 1);
  const double mid = (spec_value(f, lo) + spec_value(f, hi)) / 2;  // exact: few bits
  if (a < mid) return sign | lo;
  if (a > mid) return sign | hi;
  return sign | ((lo & 1) == 0 ? lo : hi);  // a tie: the even mantissa
}

uint8_t encode(const Ofp8& f, float x) {
  return f.has_inf ? float_to_fp8_e5m2(x) : float_to_fp8_e4m3(x);
}
float decode(const Ofp8& f, uint8_t code) {
  return f.has_inf ? fp8_e5m2_to_float(code) : fp8_e4m3_to_float(code);
}
uint8_t reference_encode(const Ofp8& f, float x) {
  return f.has_inf ? reference::f8_e5m2_from_double(x) : reference::f8_e4m3_from_double(x);
}
double reference_decode(const Ofp8& f, uint8_t code) {
  return f.has_inf ? reference::f8_e5m2_to_double(code) : reference::f8_e4m3_to_double(code);
}

// Compares an encoding with the spec's `want`: NaN by being a NaN code at all.
void expect_code(const Ofp8& f, float x, uint8_t want, uint8_t got, const char* who) {
  if (std::isnan(x)) {
    EXPECT_TRUE(std::isnan(spec_value(f, got))) << f.name << " " << who << ": NaN gave " << +got;
    return;
  }
  EXPECT_EQ(+got, +want) << f.name << " " << who << ": " << std::hexfloat << x << " ("
                         << std::defaultfloat << x << ")";
}

// x encoded by core/fp8.h, by the dtype table and by the reference backend.
void expect_encodes(const Ofp8& f, float x) {
  const uint8_t want = spec_encode(f, x);
  expect_code(f, x, want, encode(f, x), "core/fp8.h");
  expect_code(f, x, want, reference_encode(f, x), "reference backend");
  uint8_t table = 0;
  dtype_traits(f.dtype).from_float(&x, &table, 1);
  expect_code(f, x, want, table, "dtype table");
}

class Fp8 : public testing::TestWithParam<Ofp8> {};

// The spec's landmarks, stated as numbers rather than derived from the field formula, so that a
// formula wrong in the test itself would show.
TEST(Fp8Spec, LandmarksOfBothFormats) {
  EXPECT_EQ(spec_value(kE4M3, 0x7e), 448.0);
  EXPECT_EQ(spec_value(kE4M3, 0x08), 0x1p-6);  // smallest normal
  EXPECT_EQ(spec_value(kE4M3, 0x01), 0x1p-9);  // smallest subnormal
  EXPECT_EQ(spec_value(kE4M3, 0x78), 256.0);   // S.1111.000 is a number in E4M3
  EXPECT_EQ(spec_value(kE4M3, 0x38), 1.0);
  EXPECT_TRUE(std::isnan(spec_value(kE4M3, 0x7f)));
  EXPECT_EQ(spec_value(kE5M2, 0x7b), 57344.0);
  EXPECT_EQ(spec_value(kE5M2, 0x04), 0x1p-14);
  EXPECT_EQ(spec_value(kE5M2, 0x01), 0x1p-16);
  EXPECT_EQ(spec_value(kE5M2, 0x3c), 1.0);
  EXPECT_EQ(spec_value(kE5M2, 0x7c), std::numeric_limits<double>::infinity());
  EXPECT_EQ(spec_value(kE5M2, 0xfc), -std::numeric_limits<double>::infinity());
  EXPECT_EQ(std::bit_cast<uint64_t>(spec_value(kE4M3, 0x80)), std::bit_cast<uint64_t>(-0.0));
}

TEST_P(Fp8, EveryCodeDecodesToTheSpecValue) {
  const Ofp8& f = GetParam();
  std::vector<uint8_t> codes(256);
  for (int c = 0; c < 256; ++c) codes[c] = static_cast<uint8_t>(c);
  std::vector<float> table(256);
  dtype_traits(f.dtype).to_float(codes.data(), table.data(), 256);
  int nans = 0, infs = 0;
  for (int c = 0; c < 256; ++c) {
    const double want = spec_value(f, static_cast<uint8_t>(c));
    const float got = decode(f, static_cast<uint8_t>(c));
    const double ref = reference_decode(f, static_cast<uint8_t>(c));
    if (std::isnan(want)) {
      ++nans;
      EXPECT_TRUE(std::isnan(got)) << f.name << " code " << c;
      EXPECT_TRUE(std::isnan(table[c])) << f.name << " code " << c;
      EXPECT_TRUE(std::isnan(ref)) << f.name << " code " << c;
      continue;
    }
    infs += std::isinf(want);
    // Bit for bit: -0 decodes to -0.
    EXPECT_EQ(std::bit_cast<uint32_t>(got), std::bit_cast<uint32_t>(static_cast<float>(want)))
        << f.name << " code " << c << ": got " << got << ", spec " << want;
    EXPECT_EQ(std::bit_cast<uint32_t>(table[c]), std::bit_cast<uint32_t>(got)) << f.name << c;
    EXPECT_EQ(std::bit_cast<uint64_t>(ref), std::bit_cast<uint64_t>(want)) << f.name << c;
  }
  EXPECT_EQ(nans, f.has_inf ? 6 : 2);
  EXPECT_EQ(infs, f.has_inf ? 2 : 0);
}

// Every finite code (and E5M2's infinities) encodes back to itself, -0 included.
TEST_P(Fp8, EveryValueEncodesToItsCode) {
  const Ofp8& f = GetParam();
  for (int c = 0; c < 256; ++c) {
    const double v = spec_value(f, static_cast<uint8_t>(c));
    if (std::isnan(v)) continue;
    EXPECT_EQ(+encode(f, static_cast<float>(v)), c) << f.name << " " << v;
    EXPECT_EQ(+reference_encode(f, static_cast<float>(v)), c) << f.name << " " << v;
  }
}

// Halfway between every two neighbouring magnitudes (a tie: to the even mantissa) and the floats
// just either side of it (to the nearer one), across the subnormals, the binade boundaries and
// up to the largest finite.
TEST_P(Fp8, HalfwayPointsRoundToNearestEven) {
  const Ofp8& f = GetParam();
  int ties_down = 0, ties_up = 0;
  for (int c = 0; c < max_finite_code(f); ++c) {
    const double lo = spec_value(f, static_cast<uint8_t>(c));
    const double hi = spec_value(f, static_cast<uint8_t>(c + 1));
    const auto mid = static_cast<float>((lo + hi) / 2);
    ASSERT_EQ(static_cast<double>(mid), (lo + hi) / 2) << "halfway points are exact in float";
    for (float sign : {1.0f, -1.0f}) {
      expect_encodes(f, sign * mid);
      expect_encodes(f, sign * std::nextafter(mid, 0.0f));
      expect_encodes(f, sign * std::nextafter(mid, 1e9f));
    }
    const uint8_t got = encode(f, mid);
    EXPECT_EQ(got & 1, 0) << f.name << ": the tie at " << mid << " went to an odd mantissa";
    (got == c ? ties_down : ties_up)++;
  }
  EXPECT_GT(ties_down, 0);
  EXPECT_GT(ties_up, 0);
}

// The smallest subnormal and zero: half of it ties to +-0, anything above it rounds up to it,
// float subnormals become a signed zero, and -0 stays -0.
TEST_P(Fp8, SmallestSubnormalAndSignedZero) {
  const Ofp8& f = GetParam();
  const float tiny = static_cast<float>(spec_value(f, 0x01));
  EXPECT_EQ(+encode(f, tiny), 0x01);
  EXPECT_EQ(+encode(f, tiny / 2), 0x00) << "a tie goes to the even zero";
  EXPECT_EQ(+encode(f, -tiny / 2), 0x80);
  EXPECT_EQ(+encode(f, std::nextafter(tiny / 2, 1.0f)), 0x01);
  EXPECT_EQ(+encode(f, std::nextafter(tiny / 2, 0.0f)), 0x00);
  EXPECT_EQ(+encode(f, -0.0f), 0x80);
  EXPECT_EQ(+encode(f, 0.0f), 0x00);
  EXPECT_EQ(+encode(f, std::numeric_limits<float>::denorm_min()), 0x00);
  EXPECT_EQ(+encode(f, -std::numeric_limits<float>::denorm_min()), 0x80);
  for (float x : {tiny, tiny / 2, -tiny / 2, std::nextafter(tiny / 2, 1.0f), 1.5f * tiny, -0.0f,
                  std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min()})
    expect_encodes(f, x);
}

// Past the largest finite: E4M3 saturates (infinity included), E5M2 rounds to infinity from
// halfway to the next binade up (61440) and keeps the infinities.
TEST_P(Fp8, OverflowInfinityAndNaN) {
  const Ofp8& f = GetParam();
  const float inf = std::numeric_limits<float>::infinity();
  const float max = static_cast<float>(spec_value(f, max_finite_code(f)));
  if (f.has_inf) {
    EXPECT_EQ(max, 57344.0f);
    EXPECT_EQ(+encode(f, 61440.0f), 0x7c) << "a tie between 57344 and 2^16 goes to 2^16 = inf";
    EXPECT_EQ(+encode(f, std::nextafter(61440.0f, 0.0f)), 0x7b);
    EXPECT_EQ(+encode(f, inf), 0x7c);
    EXPECT_EQ(+encode(f, -inf), 0xfc);
    EXPECT_EQ(+encode(f, 1e30f), 0x7c);
  } else {
    EXPECT_EQ(max, 448.0f);
    EXPECT_EQ(+encode(f, 464.0f), 0x7e) << "halfway to 480 (the NaN code's place): 448";
    EXPECT_EQ(+encode(f, 465.0f), 0x7e) << "saturates rather than become NaN";
    EXPECT_EQ(+encode(f, 1e30f), 0x7e);
    EXPECT_EQ(+encode(f, inf), 0x7e);
    EXPECT_EQ(+encode(f, -inf), 0xfe);
    EXPECT_EQ(+encode(f, -500.0f), 0xfe);
  }
  EXPECT_EQ(+encode(f, max), +max_finite_code(f));
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (float x : {nan, -nan, std::bit_cast<float>(0x7f800001u), std::bit_cast<float>(0xffc12345u)})
    EXPECT_TRUE(std::isnan(decode(f, encode(f, x)))) << f.name << " NaN stays NaN";
  for (float x : {max, std::nextafter(max, inf), 61440.0f, std::nextafter(61440.0f, 0.0f), 464.0f,
                  465.0f, 1e30f, inf, -inf, -1e30f, nan, std::numeric_limits<float>::max()})
    expect_encodes(f, x);
}

// Random floats of every exponent a float has, and random values inside the format's range.
TEST_P(Fp8, RandomFloatsRoundLikeTheSpec) {
  const Ofp8& f = GetParam();
  std::mt19937 rng(f.has_inf ? 52 : 43);
  const auto max = static_cast<float>(spec_value(f, max_finite_code(f)));
  const auto min_normal = static_cast<float>(std::ldexp(1.0, 1 - f.bias));
  std::uniform_real_distribution<float> in_range(-1.2f * max, 1.2f * max);
  // Around the subnormals, where the spacing stops shrinking.
  std::uniform_real_distribution<float> small(-2 * min_normal, 2 * min_normal);
  for (int i = 0; i < 20000; ++i) {
    expect_encodes(f, std::bit_cast<float>(static_cast<uint32_t>(rng())));
    expect_encodes(f, in_range(rng));
    expect_encodes(f, small(rng));
    if (HasFailure()) break;  // one bad rule fails thousands of values: keep the log short
  }
}

TEST_P(Fp8, TableRowAndTensorConversion) {
  const Ofp8& f = GetParam();
  const DTypeTraits& t = dtype_traits(f.dtype);
  EXPECT_EQ(t.block_elems, 1);
  EXPECT_EQ(t.block_bytes, 1);
  EXPECT_TRUE(t.is_float);
  EXPECT_EQ(dtype_bytes(f.dtype, 10), 10u);
  EXPECT_EQ(parse_dtype(t.name), f.dtype);
  const std::vector<float> x{0.0f, -0.0f, 1.0f, -2.5f, 0.3f, 1e6f, -1e-9f};
  const Tensor q = Tensor::from_vector(x, {7}).to(f.dtype);
  EXPECT_EQ(q.nbytes(), 7u);
  const Tensor back = q.to_f32();
  for (size_t i = 0; i < x.size(); ++i) {
    const uint8_t code = static_cast<const uint8_t*>(q.raw())[i];
    EXPECT_EQ(+code, +spec_encode(f, x[i])) << x[i];
    EXPECT_EQ(back.data<float>()[i], static_cast<float>(spec_value(f, code))) << x[i];
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, Fp8, testing::Values(kE4M3, kE5M2),
                         [](const testing::TestParamInfo<Ofp8>& p) {
                           return std::string(p.param.name);
                         });

// fp8 checkpoints carry scale tensors that the frontends do not apply yet: their tensors stay
// refused by name rather than load as unscaled numbers.
TEST(Fp8Spec, SafetensorsFp8NamesStayRefused) {
  DType d;
  EXPECT_FALSE(try_parse_safetensors_dtype("F8_E4M3", &d));
  EXPECT_FALSE(try_parse_safetensors_dtype("F8_E5M2", &d));
  EXPECT_THROW(parse_dtype("q8_b32"), Error) << "q8_b32 was removed: nothing made or ran it";
}

}  // namespace
}  // namespace kiln
