// Eight-float vectors (AVX2, the build's baseline) and the fixed-order dot product the CPU
// kernels share. Inline so the attention inner loops do not pay a call per key.
#pragma once

#include <cstdint>

namespace kiln::cpu {

typedef float V8 __attribute__((vector_size(32)));
typedef float V8Unaligned __attribute__((vector_size(32), aligned(4), may_alias));

inline V8 load8(const float* p) { return *reinterpret_cast<const V8Unaligned*>(p); }

// Lanes summed in a fixed order.
inline float hsum(V8 v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

// Dot product with a fixed summation order (independent of the caller's batch).
inline float dot(const float* a, const float* b, int64_t n) {
  V8 acc = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc += load8(a + i) * load8(b + i);
  float s = hsum(acc);
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

}  // namespace kiln::cpu
