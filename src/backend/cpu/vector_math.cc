#include "backend/cpu/vector_math.h"

// GCC 12 reports the _mm512_undefined_* placeholders inside its own AVX-512 intrinsics as
// "maybe uninitialized" once they inline here (a false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace kiln::cpu {
namespace {

#define KILN_TARGET_AVX512 __attribute__((target("avx512f,avx512dq,avx2,fma")))

// The same operations as erf8 and activation8 on sixteen lanes (exp16 in vector_math.h): every
// lane's result is bit for bit the eight-lane one.
KILN_TARGET_AVX512 inline __m512 erf16(__m512 x) {
  const __m512 sign = _mm512_and_ps(x, _mm512_set1_ps(-0.0f));
  const __m512 ax = _mm512_andnot_ps(_mm512_set1_ps(-0.0f), x);
  const __m512 t = _mm512_div_ps(
      _mm512_set1_ps(1.0f), _mm512_fmadd_ps(_mm512_set1_ps(0.3275911f), ax, _mm512_set1_ps(1.0f)));
  __m512 p = _mm512_set1_ps(1.061405429f);
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-1.453152027f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(1.421413741f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(-0.284496736f));
  p = _mm512_fmadd_ps(p, t, _mm512_set1_ps(0.254829592f));
  p = _mm512_mul_ps(p, t);
  const __m512 e = exp16(_mm512_mul_ps(_mm512_mul_ps(ax, ax), _mm512_set1_ps(-1.0f)));
  const __m512 y = _mm512_fnmadd_ps(p, e, _mm512_set1_ps(1.0f));
  return _mm512_or_ps(y, sign);
}

KILN_TARGET_AVX512 inline __m512 activation16(Activation act, __m512 x) {
  const __m512 one = _mm512_set1_ps(1.0f);
  switch (act) {
    case Activation::kRelu:
      return _mm512_max_ps(x, _mm512_setzero_ps());
    case Activation::kGeluTanh: {
      const __m512 x2 = _mm512_mul_ps(x, x);
      const __m512 inner = _mm512_mul_ps(x, _mm512_fmadd_ps(x2, _mm512_set1_ps(0.044715f), one));
      const __m512 e = exp16(_mm512_mul_ps(inner, _mm512_set1_ps(-2.0f * 0.7978845608028654f)));
      return _mm512_div_ps(x, _mm512_add_ps(one, e));
    }
    case Activation::kGeluExact: {
      const __m512 erf = erf16(_mm512_mul_ps(x, _mm512_set1_ps(0.70710678118654752f)));
      return _mm512_mul_ps(_mm512_mul_ps(_mm512_set1_ps(0.5f), x), _mm512_add_ps(one, erf));
    }
    case Activation::kSilu:
      return _mm512_div_ps(x, _mm512_add_ps(one, exp16(_mm512_sub_ps(_mm512_setzero_ps(), x))));
  }
  return x;
}

}  // namespace

KILN_TARGET_AVX512 void apply_activation_avx512(Activation act, const float* x, float* y,
                                                int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, activation16(act, _mm512_loadu_ps(x + i)));
  if (i < n) {
    const auto m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(y + i, m, activation16(act, _mm512_maskz_loadu_ps(m, x + i)));
  }
}

KILN_TARGET_AVX512 void apply_gated_activation_avx512(Activation act, const float* g,
                                                      const float* u, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    _mm512_storeu_ps(
        y + i, _mm512_mul_ps(activation16(act, _mm512_loadu_ps(g + i)), _mm512_loadu_ps(u + i)));
  if (i < n) {
    const auto m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(y + i, m,
                          _mm512_mul_ps(activation16(act, _mm512_maskz_loadu_ps(m, g + i)),
                                        _mm512_maskz_loadu_ps(m, u + i)));
  }
}

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
