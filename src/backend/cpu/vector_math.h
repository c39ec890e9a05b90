// exp, erf and the activations on eight floats at a time (AVX2 + FMA, the build's baseline), so
// that GELU over a [tokens, 4096] activation costs a few multiply-adds per element instead of a
// libm call; the AVX-512 kernel family's Linear epilogues take sixteen at a time with the same
// operations (apply_activation_avx512). Accuracy: exp within 2 ulp over its range (Cephes'
// polynomial), erf within 1.5e-7 absolute (Abramowitz & Stegun 7.1.26): below what the fp32 parity
// tests resolve.
#pragma once

#include <immintrin.h>

#include <cstdint>

#include "graph/attrs.h"

namespace kiln::cpu {

// e^x; x below -87.3 gives 0, above 88.7 gives +inf, NaN stays NaN.
inline __m256 exp8(__m256 x0) {
  const __m256 hi = _mm256_set1_ps(88.7228f), lo = _mm256_set1_ps(-87.3365f);
  const __m256 nan_mask = _mm256_cmp_ps(x0, x0, _CMP_UNORD_Q);
  const __m256 over = _mm256_cmp_ps(x0, hi, _CMP_GT_OQ);
  const __m256 under = _mm256_cmp_ps(x0, lo, _CMP_LT_OQ);
  const __m256 x = _mm256_max_ps(_mm256_min_ps(x0, hi), lo);
  // x = n ln2 + r, |r| <= ln2 / 2 (ln2 split in two for an exact n ln2).
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), _mm256_add_ps(r, _mm256_set1_ps(1.0f)));
  // 2^n through the exponent field; n in [-126, 128]: split so neither factor overflows.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i half = _mm256_srai_epi32(ni, 1);
  const __m256 s1 =
      _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(half, _mm256_set1_epi32(127)), 23));
  const __m256 s2 = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, half), _mm256_set1_epi32(127)), 23));
  __m256 y = _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
  y = _mm256_blendv_ps(y, _mm256_set1_ps(__builtin_inff()), over);
  y = _mm256_andnot_ps(under, y);
  return _mm256_blendv_ps(y, x0, nan_mask);
}

// exp8's operations on sixteen lanes, for the AVX-512 kernels: every lane's result is bit for
// bit the eight-lane one (each step is an IEEE lane-wise operation, the rounding of n to an
// integer included), so a row's results do not depend on which width ran them.
__attribute__((target("avx512f,avx512dq,avx2,fma"))) inline __m512 exp16(__m512 x0) {
  const __m512 hi = _mm512_set1_ps(88.7228f), lo = _mm512_set1_ps(-87.3365f);
  const __mmask16 nan_mask = _mm512_cmp_ps_mask(x0, x0, _CMP_UNORD_Q);
  const __mmask16 over = _mm512_cmp_ps_mask(x0, hi, _CMP_GT_OQ);
  const __mmask16 under = _mm512_cmp_ps_mask(x0, lo, _CMP_LT_OQ);
  const __m512 x = _mm512_max_ps(_mm512_min_ps(x0, hi), lo);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
  const __m512i ni = _mm512_cvtps_epi32(n);
  const __m512i half = _mm512_srai_epi32(ni, 1);
  const __m512 s1 =
      _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(half, _mm512_set1_epi32(127)), 23));
  const __m512 s2 = _mm512_castsi512_ps(
      _mm512_slli_epi32(_mm512_add_epi32(_mm512_sub_epi32(ni, half), _mm512_set1_epi32(127)), 23));
  __m512 y = _mm512_mul_ps(_mm512_mul_ps(p, s1), s2);
  y = _mm512_mask_blend_ps(over, y, _mm512_set1_ps(__builtin_inff()));
  y = _mm512_maskz_mov_ps(static_cast<__mmask16>(~under), y);
  return _mm512_mask_blend_ps(nan_mask, y, x0);
}

// erf(x) = sign(x) (1 - poly(t) e^{-x^2}), t = 1 / (1 + p|x|).
inline __m256 erf8(__m256 x) {
  const __m256 sign = _mm256_and_ps(x, _mm256_set1_ps(-0.0f));
  const __m256 ax = _mm256_andnot_ps(_mm256_set1_ps(-0.0f), x);
  const __m256 t = _mm256_div_ps(
      _mm256_set1_ps(1.0f), _mm256_fmadd_ps(_mm256_set1_ps(0.3275911f), ax, _mm256_set1_ps(1.0f)));
  __m256 p = _mm256_set1_ps(1.061405429f);
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-1.453152027f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(1.421413741f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(-0.284496736f));
  p = _mm256_fmadd_ps(p, t, _mm256_set1_ps(0.254829592f));
  p = _mm256_mul_ps(p, t);
  const __m256 e = exp8(_mm256_mul_ps(_mm256_mul_ps(ax, ax), _mm256_set1_ps(-1.0f)));
  const __m256 y = _mm256_fnmadd_ps(p, e, _mm256_set1_ps(1.0f));
  return _mm256_or_ps(y, sign);
}

// One activation on eight values, HuggingFace's formulas:
// gelu_tanh 0.5 x (1 + tanh(u)) = x / (1 + e^{-2u}), u = sqrt(2/pi) (x + 0.044715 x^3);
// gelu_exact 0.5 x (1 + erf(x / sqrt 2)); silu x / (1 + e^{-x}).
inline __m256 activation8(Activation act, __m256 x) {
  const __m256 one = _mm256_set1_ps(1.0f);
  switch (act) {
    case Activation::kRelu:
      return _mm256_max_ps(x, _mm256_setzero_ps());
    case Activation::kGeluTanh: {
      const __m256 x2 = _mm256_mul_ps(x, x);
      const __m256 inner = _mm256_mul_ps(
          x, _mm256_fmadd_ps(x2, _mm256_set1_ps(0.044715f), one));  // x + 0.044715 x^3
      const __m256 e = exp8(_mm256_mul_ps(inner, _mm256_set1_ps(-2.0f * 0.7978845608028654f)));
      return _mm256_div_ps(x, _mm256_add_ps(one, e));
    }
    case Activation::kGeluExact: {
      const __m256 erf = erf8(_mm256_mul_ps(x, _mm256_set1_ps(0.70710678118654752f)));
      return _mm256_mul_ps(_mm256_mul_ps(_mm256_set1_ps(0.5f), x), _mm256_add_ps(one, erf));
    }
    case Activation::kSilu:
      return _mm256_div_ps(x, _mm256_add_ps(one, exp8(_mm256_sub_ps(_mm256_setzero_ps(), x))));
  }
  return x;
}

// y[i] = act(x[i]) (y may be x); the tail goes through the same vector code.
void apply_activation(Activation act, const float* x, float* y, int64_t n);
// The same on sixteen lanes, for the AVX-512 kernel family only (a CPU with AVX512F and DQ): the
// same operations, so every result is bit for bit apply_activation's.
void apply_activation_avx512(Activation act, const float* x, float* y, int64_t n);
// y[i] = act(g[i]) * u[i]
void apply_gated_activation(Activation act, const float* g, const float* u, float* y, int64_t n);
// The same on sixteen lanes (AVX-512 family only; bit for bit apply_gated_activation's).
void apply_gated_activation_avx512(Activation act, const float* g, const float* u, float* y,
                                   int64_t n);

}  // namespace kiln::cpu
