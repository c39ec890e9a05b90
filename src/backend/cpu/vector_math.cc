#include "backend/cpu/vector_math.h"

namespace kiln::cpu {
namespace {

// Lanes [0, n) of eight, for the tail of a row.
inline __m256i tail_mask(int64_t n) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)), lane);
}

}  // namespace

void apply_activation(Activation act, const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, activation8(act, _mm256_loadu_ps(x + i)));
  if (i < n) {
    const __m256i m = tail_mask(n - i);
    _mm256_maskstore_ps(y + i, m, activation8(act, _mm256_maskload_ps(x + i, m)));
  }
}

void apply_gated_activation(Activation act, const float* g, const float* u, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(
        y + i, _mm256_mul_ps(activation8(act, _mm256_loadu_ps(g + i)), _mm256_loadu_ps(u + i)));
  if (i < n) {
    const __m256i m = tail_mask(n - i);
    _mm256_maskstore_ps(y + i, m,
                        _mm256_mul_ps(activation8(act, _mm256_maskload_ps(g + i, m)),
                                      _mm256_maskload_ps(u + i, m)));
  }
}

}  // namespace kiln::cpu
