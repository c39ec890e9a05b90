// Eight-float vectors (AVX2, the build's baseline) and the fixed-order dot product the CPU
// kernels share. Inline so the attention inner loops do not pay a call per key.
#pragma once

#include <cstdint>

#include "core/half.h"

namespace kiln::cpu {

typedef float V8 __attribute__((vector_size(32)));
typedef float V8Unaligned __attribute__((vector_size(32), aligned(4), may_alias));

typedef uint16_t U16x8 __attribute__((vector_size(16), aligned(2), may_alias));
typedef uint32_t U32x8 __attribute__((vector_size(32)));

inline V8 load8(const float* p) { return *reinterpret_cast<const V8Unaligned*>(p); }
// Eight bf16 values (their bits) widened to f32, which is exact.
inline V8 load8(const uint16_t* p) {
  const U32x8 wide = __builtin_convertvector(*reinterpret_cast<const U16x8*>(p), U32x8) << 16;
  return reinterpret_cast<V8>(wide);
}
inline float to_f32(float v) { return v; }
inline float to_f32(uint16_t bf16) { return bf16_to_float(bf16); }

// Lanes summed in a fixed order.
inline float hsum(V8 v) {
  return ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
}

// Dot product with a fixed summation order (independent of the caller's batch); b is f32 or
// bf16 (a bf16 KV cache row).
template <class E>
inline float dot(const float* a, const E* b, int64_t n) {
  V8 acc = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc += load8(a + i) * load8(b + i);
  float s = hsum(acc);
  for (; i < n; ++i) s += a[i] * to_f32(b[i]);
  return s;
}

}  // namespace kiln::cpu
