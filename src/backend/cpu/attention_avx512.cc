// AVX-512 inner loops of CPU attention (attention_rows.h): one query row's scores against the
// key rows and the weighted sum of the value rows, over f32 or bf16 cache rows.
//
// Batched decode reads the KV cache once per step, and these loops spent more time in
// instructions than in memory: per key row and head, a 16-lane reduction of its dot product and
// two instructions to widen each 16 bf16 elements to f32 (kiln_attention_bench, bloom-560m batch
// 16 at position 109, both threads: 7.6 ms a step, 23 GB/s of bf16 cache against the ~60 GB/s
// the machine reads). Where a head's width is a multiple of 32 (every real T5 and BLOOM, and the
// fixtures), key and value rows go 16 at a time:
// - a 32-element chunk of a bf16 row is one load, split into its even and odd elements with one
//   shift and one and (the query is split the same way once per call, and the value sums are
//   interleaved back once at the end);
// - the 16 rows' dot products are reduced together in one transposed tree (15 adds of whole
//   vectors instead of 16 reductions);
// - a head's value accumulators stay in registers over the 16 rows.
// Other widths keep the row-at-a-time loops below.
//
// Summation orders are fixed by dh alone: a row's result does not depend on its batch, on how
// heads are grouped or on which 16 rows it was reduced with. A value sum adds its rows in index
// order, one FMA each, as the row-at-a-time loop does.
#include <immintrin.h>

#include <algorithm>
#include <type_traits>
#include <vector>

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
KILN_TARGET_AVX512 void scores_avx512(const float* q, const E* const* keys,
                                      const E* const* /*then*/, int64_t h0, int64_t nh, int64_t dh,
                                      int64_t n, float* scores, int64_t ld) {
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

// ---- 16 rows at a time, heads whose width is a multiple of 32 ----

constexpr int kGroupRows = 16;

// A 32-element chunk of a row as two f32 vectors. bf16: the even elements, then the odd ones (a
// bf16 sits in the high half of an f32, so a shift or a mask widens 16 of them at once). f32: the
// first 16 elements, then the next 16.
struct ChunkPair {
  __m512 a, b;
};
KILN_TARGET_AVX512 inline ChunkPair load_chunk(const float* p) {
  return {_mm512_loadu_ps(p), _mm512_loadu_ps(p + 16)};
}
KILN_TARGET_AVX512 inline ChunkPair load_chunk(const uint16_t* p) {
  const __m512i raw = _mm512_loadu_si512(p);
  return {
      _mm512_castsi512_ps(_mm512_slli_epi32(raw, 16)),
      _mm512_castsi512_ps(_mm512_and_si512(raw, _mm512_set1_epi32(static_cast<int>(0xffff0000u))))};
}

// The 32-element chunks of `src` (`chunks` of them) in the order load_chunk<E> gives: for bf16
// rows each chunk's even elements, then its odd ones; for f32 rows unchanged.
template <class E>
KILN_TARGET_AVX512 void split_chunks(const float* src, int64_t chunks, float* dst) {
  if constexpr (std::is_same_v<E, float>) {
    std::copy(src, src + chunks * 32, dst);
  } else {
    const __m512i even =
        _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    for (int64_t c = 0; c < chunks; ++c) {
      const __m512 lo = _mm512_loadu_ps(src + 32 * c), hi = _mm512_loadu_ps(src + 32 * c + 16);
      _mm512_storeu_ps(dst + 32 * c, _mm512_permutex2var_ps(lo, even, hi));
      _mm512_storeu_ps(dst + 32 * c + 16, _mm512_permutex2var_ps(lo, odd, hi));
    }
  }
}

// The inverse of split_chunks, in place.
template <class E>
KILN_TARGET_AVX512 void join_chunks(float* p, int64_t chunks) {
  if constexpr (!std::is_same_v<E, float>) {
    const __m512i lo_idx =
        _mm512_setr_epi32(0, 16, 1, 17, 2, 18, 3, 19, 4, 20, 5, 21, 6, 22, 7, 23);
    const __m512i hi_idx = _mm512_add_epi32(lo_idx, _mm512_set1_epi32(8));
    for (int64_t c = 0; c < chunks; ++c) {
      const __m512 e = _mm512_loadu_ps(p + 32 * c), o = _mm512_loadu_ps(p + 32 * c + 16);
      _mm512_storeu_ps(p + 32 * c, _mm512_permutex2var_ps(e, lo_idx, o));
      _mm512_storeu_ps(p + 32 * c + 16, _mm512_permutex2var_ps(e, hi_idx, o));
    }
  }
}

// out lane r = the sum of a[r]'s 16 lanes, for all 16 vectors at once: lanes i and i + 8 added,
// then i and i + 4, i and i + 2, i and i + 1 (the same order for every r).
KILN_TARGET_AVX512 inline __m512 reduce_transposed(const __m512 (&a)[kGroupRows]) {
  __m512 b[8], c[4], d[2];
  for (int j = 0; j < 8; ++j)  // b[j]: halves of a[j] (lanes 0-7) and a[j + 8] (8-15)
    b[j] = _mm512_add_ps(_mm512_shuffle_f32x4(a[j], a[j + 8], 0x44),
                         _mm512_shuffle_f32x4(a[j], a[j + 8], 0xee));
  for (int j = 0; j < 4; ++j)  // c[j]: quarters of a[j], a[j + 8], a[j + 4], a[j + 12]
    c[j] = _mm512_add_ps(_mm512_shuffle_f32x4(b[j], b[j + 4], 0x88),
                         _mm512_shuffle_f32x4(b[j], b[j + 4], 0xdd));
  for (int j = 0; j < 2; ++j)  // d[j]: per 128-bit part, pairs of a[j + o] and a[j + 2 + o]
    d[j] = _mm512_add_ps(_mm512_shuffle_ps(c[j], c[j + 2], 0x44),
                         _mm512_shuffle_ps(c[j], c[j + 2], 0xee));
  // Per 128-bit part k (o = 0, 8, 4, 12): the sums of a[o], a[o + 2], a[o + 1], a[o + 3].
  const __m512 e =
      _mm512_add_ps(_mm512_shuffle_ps(d[0], d[1], 0x88), _mm512_shuffle_ps(d[0], d[1], 0xdd));
  const __m512i order = _mm512_setr_epi32(0, 2, 1, 3, 8, 10, 9, 11, 4, 6, 5, 7, 12, 14, 13, 15);
  return _mm512_permutexvar_ps(order, e);
}

template <int C, class E>  // C: 32-element chunks a head
KILN_TARGET_AVX512 void scores_grouped(const float* q, const E* const* keys, const E* const* then,
                                       int64_t h0, int64_t nh, int64_t n, float* scores,
                                       int64_t ld) {
  constexpr int64_t dh = 32 * C;
  static thread_local std::vector<float> split;
  split.resize(static_cast<size_t>(nh * dh));
  split_chunks<E>(q + h0 * dh, nh * C, split.data());
  for (int64_t j0 = 0; j0 < n; j0 += kGroupRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kGroupRows, n - j0));
    // Lanes past the last row reduce a copy of the first row and are not stored.
    const E* row[kGroupRows];
    for (int r = 0; r < kGroupRows; ++r) row[r] = keys[j0 + (r < rows ? r : 0)] + h0 * dh;
    const int64_t ahead = std::min(n, j0 + kGroupRows + kGroupRows);
    const __mmask16 store = static_cast<__mmask16>((1u << rows) - 1u);
    for (int64_t h = 0; h < nh; ++h) {
      const float* qh = split.data() + h * dh;
      // The next group's slices of this head, spread over the heads: requested all at once
      // they overflowed the core's queue of misses and the prefetches themselves stalled.
      for (int64_t r = j0 + kGroupRows; r < ahead; ++r) prefetch_slice(keys[r] + (h0 + h) * dh, dh);
      // In the last group, the weighted sum's first rows, which nothing else requests.
      if (j0 + kGroupRows >= n)
        for (int64_t r = 0; r < std::min<int64_t>(n, kGroupRows); ++r)
          prefetch_slice(then[r] + (h0 + h) * dh, dh);
      __m512 acc[kGroupRows];
#pragma GCC unroll 16
      for (int r = 0; r < kGroupRows; ++r) acc[r] = _mm512_setzero_ps();
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) {
        const __m512 qa = _mm512_loadu_ps(qh + 32 * c), qb = _mm512_loadu_ps(qh + 32 * c + 16);
#pragma GCC unroll 16
        for (int r = 0; r < kGroupRows; ++r) {
          const ChunkPair k = load_chunk(row[r] + h * dh + 32 * c);
          acc[r] = _mm512_fmadd_ps(qb, k.b, _mm512_fmadd_ps(qa, k.a, acc[r]));
        }
      }
      _mm512_mask_storeu_ps(scores + h * ld + j0, store, reduce_transposed(acc));
    }
  }
}

template <int C, class E>
KILN_TARGET_AVX512 void weighted_sum_grouped(const float* p, int64_t ldp, const E* const* values,
                                             int64_t h0, int64_t nh, int64_t n, float* acc) {
  constexpr int64_t dh = 32 * C;
  std::fill(acc, acc + nh * dh, 0.0f);
  for (int64_t j0 = 0; j0 < n; j0 += kGroupRows) {
    const int rows = static_cast<int>(std::min<int64_t>(kGroupRows, n - j0));
    const int64_t ahead = std::min(n, j0 + kGroupRows + kGroupRows);
    for (int64_t h = 0; h < nh; ++h) {
      float* ah = acc + h * dh;
      for (int64_t r = j0 + kGroupRows; r < ahead; ++r)
        prefetch_slice(values[r] + (h0 + h) * dh, dh);
      __m512 a[C], b[C];
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) {
        a[c] = _mm512_loadu_ps(ah + 32 * c);
        b[c] = _mm512_loadu_ps(ah + 32 * c + 16);
      }
      const float* ph = p + h * ldp + j0;
      for (int r = 0; r < rows; ++r) {
        const __m512 w = _mm512_set1_ps(ph[r]);
        const E* vr = values[j0 + r] + (h0 + h) * dh;
#pragma GCC unroll 4
        for (int c = 0; c < C; ++c) {
          const ChunkPair v = load_chunk(vr + 32 * c);
          a[c] = _mm512_fmadd_ps(w, v.a, a[c]);
          b[c] = _mm512_fmadd_ps(w, v.b, b[c]);
        }
      }
#pragma GCC unroll 4
      for (int c = 0; c < C; ++c) {
        _mm512_storeu_ps(ah + 32 * c, a[c]);
        _mm512_storeu_ps(ah + 32 * c + 16, b[c]);
      }
    }
  }
  join_chunks<E>(acc, nh * C);
}

// The loops for one head width: grouped for 32, 64 and 128, row at a time otherwise.
template <class E>
KILN_TARGET_AVX512 void scores_dispatch(const float* q, const E* const* keys, const E* const* then,
                                        int64_t h0, int64_t nh, int64_t dh, int64_t n,
                                        float* scores, int64_t ld) {
  switch (dh) {
    case 32:
      return scores_grouped<1>(q, keys, then, h0, nh, n, scores, ld);
    case 64:
      return scores_grouped<2>(q, keys, then, h0, nh, n, scores, ld);
    case 128:
      return scores_grouped<4>(q, keys, then, h0, nh, n, scores, ld);
    default:
      return scores_avx512(q, keys, then, h0, nh, dh, n, scores, ld);
  }
}

template <class E>
KILN_TARGET_AVX512 void weighted_sum_dispatch(const float* p, int64_t ldp, const E* const* values,
                                              int64_t h0, int64_t nh, int64_t dh, int64_t n,
                                              float* acc) {
  switch (dh) {
    case 32:
      return weighted_sum_grouped<1>(p, ldp, values, h0, nh, n, acc);
    case 64:
      return weighted_sum_grouped<2>(p, ldp, values, h0, nh, n, acc);
    case 128:
      return weighted_sum_grouped<4>(p, ldp, values, h0, nh, n, acc);
    default:
      return weighted_sum_avx512(p, ldp, values, h0, nh, dh, n, acc);
  }
}

}  // namespace

AttentionRowLoops<float> avx512_row_loops_f32() {
  return {scores_dispatch<float>, weighted_sum_dispatch<float>};
}
AttentionRowLoops<uint16_t> avx512_row_loops_bf16() {
  return {scores_dispatch<uint16_t>, weighted_sum_dispatch<uint16_t>};
}

}  // namespace kiln::cpu
