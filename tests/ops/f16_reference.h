// IEEE binary16 and bfloat16 decoded and encoded from the formats' definitions, independent of
// kiln's own conversions (core/half.h) and of the reference backend's.
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

namespace kiln::test {

inline double f16_value(uint16_t h) {
  const double sign = (h & 0x8000) ? -1.0 : 1.0;
  const int exp = (h >> 10) & 0x1f, mant = h & 0x3ff;
  if (exp == 0x1f) return mant ? NAN : sign * INFINITY;
  if (exp == 0) return sign * std::ldexp(mant, -24);
  return sign * std::ldexp(1024 + mant, exp - 25);
}

// bfloat16 is the upper half of a binary32.
inline double bf16_value(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

// The encoding of f in a format with `mant_bits` stored mantissa bits, exponent bias `bias` and
// `exp_bits` exponent bits, rounded to nearest with ties to even (std::nearbyint in the default
// rounding mode) from the value in double. NaN becomes the quiet NaN with the sign kept.
inline uint16_t float_bits_nearest_even(float f, int mant_bits, int exp_bits, int bias) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const auto inf = static_cast<uint16_t>(((1 << exp_bits) - 1) << mant_bits);
  const double a = std::fabs(static_cast<double>(f));
  if (std::isnan(a)) return sign | inf | static_cast<uint16_t>(1 << (mant_bits - 1));
  if (std::isinf(a)) return sign | inf;
  if (a == 0.0) return sign;
  int e = 0;
  std::frexp(a, &e);             // a in [2^(e-1), 2^e)
  const int min_exp = 1 - bias;  // below it the spacing stays fixed
  const int exp = std::max(e - 1, min_exp);
  const double ulp = std::ldexp(1.0, exp - mant_bits);
  const double q = std::nearbyint(a / ulp);
  const double r = q * ulp;
  if (r >= std::ldexp(1.0, (1 << exp_bits) - 1 - bias)) return sign | inf;
  if (r < std::ldexp(1.0, min_exp)) return sign | static_cast<uint16_t>(q);  // subnormal
  std::frexp(r, &e);
  const int rexp = e - 1;
  const auto mant = static_cast<uint16_t>(std::ldexp(r, mant_bits - rexp) - (1 << mant_bits));
  return sign | static_cast<uint16_t>((rexp + bias) << mant_bits) | mant;
}

inline uint16_t f16_bits(float f) { return float_bits_nearest_even(f, 10, 5, 15); }
inline uint16_t bf16_bits(float f) { return float_bits_nearest_even(f, 7, 8, 127); }

}  // namespace kiln::test
