// IEEE binary16 and bfloat16 <-> float conversion, bit-exact with round-to-nearest-even.
#pragma once

#include <bit>
#include <cstdint>

namespace kiln {

inline float fp16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  uint32_t exp = (h >> 10) & 0x1fu;
  uint32_t mant = h & 0x3ffu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      exp = 127 - 15 + 1;
      while ((mant & 0x400u) == 0) {
        mant <<= 1;
        --exp;
      }
      mant &= 0x3ffu;
      bits = sign | (exp << 23) | (mant << 13);
    }
  } else if (exp == 0x1f) {
    bits = sign | 0x7f800000u | (mant << 13);
  } else {
    bits = sign | ((exp + 127 - 15) << 23) | (mant << 13);
  }
  return std::bit_cast<float>(bits);
}

inline uint16_t float_to_fp16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or nan
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {  // result is subnormal or zero
    if (abs < 0x33000000u) return static_cast<uint16_t>(sign);
    const uint32_t e = abs >> 23;
    const uint32_t m = (abs & 0x7fffffu) | 0x800000u;
    const uint32_t shift = 126 - e;  // value / 2^-24 == m >> shift
    const uint32_t rem = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    uint32_t r = m >> shift;
    if (rem > half || (rem == half && (r & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  uint32_t r = abs - 0x38000000u;  // rebias exponent 127 -> 15
  const uint32_t rem = r & 0x1fffu;
  r >>= 13;
  if (rem > 0x1000u || (rem == 0x1000u && (r & 1u))) ++r;
  return static_cast<uint16_t>(sign | r);
}

inline float bf16_to_float(uint16_t h) {
  return std::bit_cast<float>(static_cast<uint32_t>(h) << 16);
}

inline uint16_t float_to_bf16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet nan
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

}  // namespace kiln
