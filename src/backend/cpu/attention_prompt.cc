// Encoder self-attention of a whole sequence, one head at a time, in register tiles (AVX-512).
//
// The row-at-a-time loops (attention_rows.h) serve decode, where each query row meets its keys
// once. A prompt's every query row meets every key, and there those loops re-read each key and
// value row once per query, a load for every multiply-add: flan-t5-base int8-weight's encoder
// spent ~0.4 ms a layer on attention for 78 tokens (~45 GFLOP/s, 16 % of its prompt step). Here
// a head's keys are first transposed into kt [dh][keys] (zero-padded to 16 keys), so that:
// - scores: kQueries query rows × up to 64 keys are a tile of accumulators; per element d of
//   the head, 4 key vectors are loaded and each query row's q[d] broadcast against them;
// - the weighted values: kQueries rows × 64 elements of the head are the tile; per key j, 4
//   value vectors are loaded and each row's probability broadcast.
//
// Sums: a score is one FMA chain over d in order, a weighted value one FMA chain over the keys
// in order, and each row's softmax depends on that row alone: a row's result depends neither on
// its batch nor on the rows it is tiled with.
#include <immintrin.h>

#include <algorithm>
#include <cmath>

#include "backend/cpu/attention_rows.h"
#include "backend/cpu/vector_math.h"

// GCC 12 reports the _mm512_undefined_* placeholders inside its own AVX-512 intrinsics as
// "maybe uninitialized" once they inline here (a false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace kiln::cpu {
namespace {

#define KILN_TARGET_AVX512 __attribute__((target("avx512f,avx512dq,avx512bw,avx512vl,avx2,fma")))

constexpr int kQueries = 6;  // query rows a tile: 6 × 4 accumulators, 4 loads, 1 broadcast
constexpr int kVectors = 4;  // 16-lane vectors a tile: 64 keys (scores) or 64 elements (values)

int64_t padded_keys(int64_t tokens) { return (tokens + 15) / 16 * 16; }

// kt[d * ld + j] = k[j * stride + d] for d < dh, j < n; keys n .. ld - 1 zero.
KILN_TARGET_AVX512 void transpose_keys(const float* k, int64_t stride, int64_t n, int64_t dh,
                                       float* kt, int64_t ld) {
  for (int64_t d = 0; d < dh; ++d) std::fill(kt + d * ld + n, kt + d * ld + ld, 0.0f);
  for (int64_t j = 0; j < n; ++j) {
    const float* kr = k + j * stride;
    for (int64_t d = 0; d < dh; ++d) kt[d * ld + j] = kr[d];
  }
}

// out_r[c0 .. c0 + 16V) = (Σ_t a_r[t] · b[t · ldb + c0 ..]) · scale[r] for R rows, t < len in
// order (one FMA chain per output; scale null: unscaled). Both products of a head: the scores
// (a_r: query row r, b: the transposed keys, t over the head's elements) and the weighted values
// (a_r: row r's probabilities, b: the value rows, t over the keys).
template <int R, int V>
KILN_TARGET_AVX512 void product_tile(const float* const* a, const float* b, int64_t ldb,
                                     int64_t len, int64_t c0, const float* scale,
                                     float* const* out) {
  __m512 acc[R][V];
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) acc[r][v] = _mm512_setzero_ps();
  for (int64_t t = 0; t < len; ++t) {
    __m512 bv[V];
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v) bv[v] = _mm512_loadu_ps(b + t * ldb + c0 + 16 * v);
#pragma GCC unroll 8
    for (int r = 0; r < R; ++r) {
      const __m512 ab = _mm512_set1_ps(a[r][t]);
#pragma GCC unroll 4
      for (int v = 0; v < V; ++v) acc[r][v] = _mm512_fmadd_ps(ab, bv[v], acc[r][v]);
    }
  }
#pragma GCC unroll 8
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 4
    for (int v = 0; v < V; ++v)
      _mm512_storeu_ps(
          out[r] + c0 + 16 * v,
          scale != nullptr ? _mm512_mul_ps(acc[r][v], _mm512_set1_ps(scale[r])) : acc[r][v]);
}

// product_tile over columns [0, width) (a multiple of 16), kVectors vectors at a time.
template <int R>
KILN_TARGET_AVX512 void product_rows(const float* const* a, const float* b, int64_t ldb,
                                     int64_t len, int64_t width, const float* scale,
                                     float* const* out) {
  int64_t c0 = 0;
  for (; c0 + 16 * kVectors <= width; c0 += 16 * kVectors)
    product_tile<R, kVectors>(a, b, ldb, len, c0, scale, out);
  switch ((width - c0) / 16) {
    case 3:
      product_tile<R, 3>(a, b, ldb, len, c0, scale, out);
      break;
    case 2:
      product_tile<R, 2>(a, b, ldb, len, c0, scale, out);
      break;
    case 1:
      product_tile<R, 1>(a, b, ldb, len, c0, scale, out);
      break;
    default:
      break;
  }
}

// One row of scores (n keys from position 0, query at position i) into probabilities, not yet
// normalized: scale, bias, e^(x - max) in place; returns 1 / their sum.
KILN_TARGET_AVX512 float softmax_row(float* s, int64_t n, int64_t i, const PromptHead& p) {
  const __m512 scale = _mm512_set1_ps(p.scale);
  const float slope = p.slope;
  const float* bias = p.t5_bias != nullptr ? p.t5_bias - i : nullptr;  // key j: bias[j]
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = _cvtu32_mask16(n - j >= 16 ? 0xffffu : (1u << (n - j)) - 1);
    __m512 x = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, s + j), scale);
    if (bias != nullptr) x = _mm512_add_ps(x, _mm512_maskz_loadu_ps(m, bias + j));
    if (slope != 0.0f) {
      const __m512 pos =
          _mm512_add_ps(_mm512_set1_ps(static_cast<float>(j)),
                        _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
      x = _mm512_fmadd_ps(_mm512_set1_ps(slope), pos, x);
    }
    _mm512_mask_storeu_ps(s + j, m, x);
    mx = _mm512_mask_max_ps(mx, m, mx, x);
  }
  const float largest = _mm512_reduce_max_ps(mx);
  // e^(x - largest) sixteen at a time, the last block masked (lanes past the row: e^-inf = 0,
  // not stored; scalar exponentials of a 78-key row's last 6 keys were a fifth of the softmax),
  // the lane sums added in a fixed order.
  const __m512 m16 = _mm512_set1_ps(largest);
  __m512 sum16 = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = _cvtu32_mask16(n - j >= 16 ? 0xffffu : (1u << (n - j)) - 1);
    const __m512 x = _mm512_mask_loadu_ps(_mm512_set1_ps(-INFINITY), m, s + j);
    const __m512 e = exp16(_mm512_sub_ps(x, m16));
    _mm512_mask_storeu_ps(s + j, m, e);
    sum16 = _mm512_add_ps(sum16, e);
  }
  const __m256 halves =
      _mm256_add_ps(_mm512_castps512_ps256(sum16),
                    _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(sum16), 1)));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, halves);
  const float sum = ((lanes[0] + lanes[4]) + (lanes[1] + lanes[5])) +
                    ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]));
  return sum > 0.0f ? 1.0f / sum : 0.0f;
}

template <int R>
KILN_TARGET_AVX512 void query_block(const PromptHead& p, int64_t i0, const float* kt, int64_t ld,
                                    float* s) {
  const int64_t off = p.head * p.dh;
  const float* q[R];
  float* rows[R];  // row r's scores, then its probabilities
  float* out[R];
  float inv[R];
  for (int r = 0; r < R; ++r) {
    q[r] = p.q + (i0 + r) * p.q_stride + off;
    rows[r] = s + r * ld;
    out[r] = p.y + (i0 + r) * p.y_stride + off;
  }
  product_rows<R>(q, kt, ld, p.dh, ld, nullptr, rows);
  for (int r = 0; r < R; ++r) inv[r] = softmax_row(rows[r], p.tokens, i0 + r, p);
  product_rows<R>(rows, p.v + off, p.kv_stride, p.tokens, p.dh, inv, out);
}

}  // namespace

int64_t prompt_head_scratch_floats(int64_t tokens, int64_t dh) {
  return (dh + kQueries) * padded_keys(tokens);
}

KILN_TARGET_AVX512 void prompt_head_avx512(const PromptHead& p, float* scratch) {
  const int64_t ld = padded_keys(p.tokens);
  float* kt = scratch;
  float* s = scratch + p.dh * ld;
  transpose_keys(p.k + p.head * p.dh, p.kv_stride, p.tokens, p.dh, kt, ld);
  int64_t i0 = 0;
  for (; i0 + kQueries <= p.tokens; i0 += kQueries) query_block<kQueries>(p, i0, kt, ld, s);
  switch (p.tokens - i0) {
    case 5:
      query_block<5>(p, i0, kt, ld, s);
      break;
    case 4:
      query_block<4>(p, i0, kt, ld, s);
      break;
    case 3:
      query_block<3>(p, i0, kt, ld, s);
      break;
    case 2:
      query_block<2>(p, i0, kt, ld, s);
      break;
    case 1:
      query_block<1>(p, i0, kt, ld, s);
      break;
    default:
      break;
  }
}

}  // namespace kiln::cpu
