// OCP 8-bit floats (the "OCP 8-bit Floating Point Specification (OFP8)", rev. 1.0) <-> float,
// bit-exact with round-to-nearest-even, subnormals included.
//
//   E4M3 ("E4M3FN"): S.EEEE.MMM, exponent bias 7. No infinities; the only NaN is S.1111.111, so
//     S.1111.000-110 are normal numbers: the largest finite is ±448 (S.1111.110), the smallest
//     normal 2^-6 (S.0001.000), the smallest subnormal 2^-9 (S.0000.001).
//   E5M2: S.EEEEE.MM, exponent bias 15, IEEE 754 like (binary16's top byte): ±inf is S.11111.00,
//     NaN S.11111.{01,10,11}; the largest finite is ±57344 (S.11110.11), the smallest normal
//     2^-14, the smallest subnormal 2^-16.
//
// Conversions from float, the saturation behaviour each format has:
//   E4M3 saturates (OFP8's saturation mode, CUDA's __NV_SATFINITE): any value whose rounding
//     lies beyond ±448, the infinities included, becomes ±448. Without it an overflow could only
//     become NaN (the format has no infinity), which would poison every sum it enters.
//   E5M2 does not (OFP8's non-saturating mode, IEEE 754's rounding): a value that rounds beyond
//     ±57344 (|x| >= 61440, halfway to 2^16, ties going to the even 2^16) becomes ±inf, and the
//     infinities stay infinite (an attention mask's -inf survives).
//   Both: NaN becomes NaN (E4M3 S.1111.111, E5M2 the quiet S.11111.10, the sign kept); -0 stays
//     -0; a magnitude up to half the smallest subnormal becomes ±0 (exactly half ties to the
//     even 0), one above it the smallest subnormal.
#pragma once

#include <bit>
#include <cstdint>

namespace kiln {

namespace fp8_detail {

// |x| (float bits, finite and non-negative) rounded to nearest even in a format of `mant_bits`
// mantissa bits and exponent bias `bias`, as the magnitude bits of the code: subnormals are
// integer multiples of the smallest subnormal 2^(1 - bias - mant_bits) (code = that multiple, so
// a subnormal that rounds up to the smallest normal carries into the exponent field by itself),
// normals the float's bits with the exponent rebiased and the mantissa cut. The result may lie
// past the format's largest code; the caller saturates or overflows.
inline uint32_t round_magnitude(uint32_t abs, int mant_bits, int bias) {
  const uint32_t min_normal = static_cast<uint32_t>(127 + 1 - bias) << 23;
  if (abs < min_normal) {
    // value / smallest subnormal = m * 2^(e - 150 - (1 - bias - mant_bits)) = m >> shift.
    const int e = static_cast<int>(abs >> 23);
    const int shift = 150 + 1 - bias - mant_bits - e;
    if (shift >= 25) return 0;  // below half the smallest subnormal (or zero)
    const uint32_t m = (abs & 0x7fffffu) | 0x800000u;  // e > 0 here: float subnormals are 0
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    uint32_t r = m >> shift;
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return r;
  }
  const int cut = 23 - mant_bits;
  uint32_t r = abs - (static_cast<uint32_t>(127 - bias) << 23);
  const uint32_t rem = r & ((1u << cut) - 1);
  const uint32_t half = 1u << (cut - 1);
  r >>= cut;
  if (rem > half || (rem == half && (r & 1u))) ++r;
  return r;
}

}  // namespace fp8_detail

inline float fp8_e4m3_to_float(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exp = (b >> 3) & 0xfu, mant = b & 0x7u;
  if (exp == 0xf && mant == 0x7) return std::bit_cast<float>(sign | 0x7fc00000u);
  if (exp == 0) {  // zero or subnormal: mant * 2^-9, exact in float
    const float v = static_cast<float>(mant) * 0x1p-9f;
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exp + 127 - 7) << 23) | (mant << 20));
}

inline uint8_t float_to_fp8_e4m3(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7fu;  // NaN
  constexpr uint32_t kMaxFinite = 0x7eu;       // 448
  // An infinity rebiases to a code far past the largest: it saturates like any overflow.
  const uint32_t r = fp8_detail::round_magnitude(abs, 3, 7);
  return static_cast<uint8_t>(sign | (r > kMaxFinite ? kMaxFinite : r));
}

inline float fp8_e5m2_to_float(uint8_t b) {
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exp = (b >> 2) & 0x1fu, mant = b & 0x3u;
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 21));  // inf, NaN
  if (exp == 0) {  // zero or subnormal: mant * 2^-16, exact in float
    const float v = static_cast<float>(mant) * 0x1p-16f;
    return sign ? -v : v;
  }
  return std::bit_cast<float>(sign | ((exp + 127 - 15) << 23) | (mant << 21));
}

inline uint8_t float_to_fp8_e5m2(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const auto sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return sign | 0x7eu;  // quiet NaN
  constexpr uint32_t kInf = 0x7cu;
  const uint32_t r = fp8_detail::round_magnitude(abs, 2, 15);  // infinity: far past kInf
  return static_cast<uint8_t>(sign | (r > kInf ? kInf : r));
}

}  // namespace kiln
