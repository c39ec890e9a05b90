// AVX-512 inner loops of CPU attention (attention_rows.h): one query row's scores against the
// key rows and the weighted sum of the value rows, over f32 or bf16 cache rows.
//
// Batched decode reads the KV cache once per step, and the AVX2 loops spent more time in
// instructions than in memory (kiln_attention_bench, bloom-560m batch 16 on one thread: ~11
// GB/s of bf16 cache, against ~14 for f32 rows of the same count: per-row work, not bytes, set
// the pace). Here a 64-wide head is four 16-lane FMAs and one reduction, and the weighted sum
// reads and writes each accumulator once per four value rows instead of once per row.
// Summation orders are fixed by dh alone: a row's result does not depend on its batch or on
// how heads are grouped.
#include <immintrin.h>

#include <algorithm>

#include "backend/cpu/attention_rows.h"

// GCC 12 reports the _mm512_undefined_* placeholders inside its own AVX-512 widening
// intrinsics as "maybe uninitialized" once they inline here (a false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

namespace kiln::cpu {
namespace {

#define KILN_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx2,fma")))

KILN_TARGET_AVX512 inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
KILN_TARGET_AVX512 inline __m512 load16(const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
// The first `m` lanes (a mask), zeros elsewhere.
KILN_TARGET_AVX512 inline __m512 load16(const float* p, __mmask16 m) {
  return _mm512_maskz_loadu_ps(m, p);
}
KILN_TARGET_AVX512 inline __m512 load16(const uint16_t* p, __mmask16 m) {
  const __m256i h = _mm256_maskz_loadu_epi16(m, p);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// Lanes summed in a fixed order (halves, then quarters, ...).
KILN_TARGET_AVX512 inline float reduce16(__m512 v) {
  const __m256 h = _mm256_add_ps(_mm512_castps512_ps256(v),
                                 _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
  const __m128 q = _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  const __m128 e = _mm_add_ps(q, _mm_movehl_ps(q, q));
  return _mm_cvtss_f32(_mm_add_ss(e, _mm_movehdup_ps(e)));
}

template <class E>
KILN_TARGET_AVX512 void scores_avx512(const float* q, const E* const* keys, int64_t h0, int64_t nh,
                                      int64_t dh, int64_t n, float* scores, int64_t ld) {
  const int64_t full = dh / 16 * 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (dh - full)) - 1u);
  const float* q0 = q + h0 * dh;
  for (int64_t j = 0; j < n; ++j) {
    if (j + kRowsAhead < n) prefetch_slice(keys[j + kRowsAhead] + h0 * dh, nh * dh);
    const E* kr = keys[j] + h0 * dh;
    for (int64_t h = 0; h < nh; ++h) {
      const float* qh = q0 + h * dh;
      const E* kh = kr + h * dh;
      __m512 acc = _mm512_setzero_ps();
      int64_t d = 0;
      for (; d < full; d += 16) acc = _mm512_fmadd_ps(load16(qh + d), load16(kh + d), acc);
      if (tail) acc = _mm512_fmadd_ps(load16(qh + d, tail), load16(kh + d, tail), acc);
      scores[h * ld + j] = reduce16(acc);
    }
  }
}

// acc[c] over the value rows j0..j0+R-1 for the 16 lanes at column c of a head.
template <int R, class E>
KILN_TARGET_AVX512 inline void accumulate_rows(float* acc, const __m512* w, const E* const* v,
                                               int64_t col, __mmask16 m, bool masked) {
  __m512 a = masked ? _mm512_maskz_loadu_ps(m, acc) : _mm512_loadu_ps(acc);
  for (int r = 0; r < R; ++r)
    a = _mm512_fmadd_ps(w[r], masked ? load16(v[r] + col, m) : load16(v[r] + col), a);
  if (masked)
    _mm512_mask_storeu_ps(acc, m, a);
  else
    _mm512_storeu_ps(acc, a);
}

// Value rows j..j+R-1 into every head's accumulators (R FMAs per accumulator load and store,
// in row order).
template <int R, class E>
KILN_TARGET_AVX512 inline void weighted_rows(const float* p, int64_t ldp, const E* const* values,
                                             int64_t j, int64_t h0, int64_t nh, int64_t dh,
                                             float* acc) {
  const int64_t full = dh / 16 * 16;
  const __mmask16 tail = static_cast<__mmask16>((1u << (dh - full)) - 1u);
  for (int64_t h = 0; h < nh; ++h) {
    __m512 w[R];
    const E* v[R];
    for (int r = 0; r < R; ++r) {
      w[r] = _mm512_set1_ps(p[h * ldp + j + r]);
      v[r] = values[j + r] + (h0 + h) * dh;
    }
    float* ah = acc + h * dh;
    int64_t d = 0;
    for (; d < full; d += 16) accumulate_rows<R>(ah + d, w, v, d, tail, false);
    if (tail) accumulate_rows<R>(ah + d, w, v, d, tail, true);
  }
}

template <class E>
KILN_TARGET_AVX512 void weighted_sum_avx512(const float* p, int64_t ldp, const E* const* values,
                                            int64_t h0, int64_t nh, int64_t dh, int64_t n,
                                            float* acc) {
  std::fill(acc, acc + nh * dh, 0.0f);
  constexpr int kRows = 4;
  int64_t j = 0;
  for (; j + kRows <= n; j += kRows) {
    for (int64_t r = j + kRowsAhead; r < std::min(n, j + kRowsAhead + kRows); ++r)
      prefetch_slice(values[r] + h0 * dh, nh * dh);
    weighted_rows<kRows>(p, ldp, values, j, h0, nh, dh, acc);
  }
  for (; j < n; ++j) weighted_rows<1>(p, ldp, values, j, h0, nh, dh, acc);
}

}  // namespace

AttentionRowLoops<float> avx512_row_loops_f32() {
  return {scores_avx512<float>, weighted_sum_avx512<float>};
}
AttentionRowLoops<uint16_t> avx512_row_loops_bf16() {
  return {scores_avx512<uint16_t>, weighted_sum_avx512<uint16_t>};
}

}  // namespace kiln::cpu
