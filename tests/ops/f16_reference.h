// IEEE binary16 decoded from the format's definition, independent of kiln's own conversion.
#pragma once

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

}  // namespace kiln::test
