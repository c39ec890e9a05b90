// The int8-weight Linear of the AVX2 family in integer dot products, for calls below the prefill's
// row count (decode at any batch; prefill widens the weights for oneDNN's sgemm,
// kernels_lowp.cc).
//
// Why: widening each i8 weight to f32 costs a sign extension, a conversion and an FMA per eight
// weights; on a 2-core AVX2-only EPYC that made batch-1 decode of bloom-560m compute-bound at
// 45 % of the memory roofline, and batched decode paid it once per row. AVX2 has integer
// multiply-adds (vpmaddwd: 16 products of int16 pairs summed into 8 int32 lanes); with the
// weights sign-extended to int16 once per tile (vpmovsxbw), 16 weights cost one extension per
// tile and one vpmaddwd + vpaddd per row, where the f32 path needed six instructions per row.
// vpmaddubsw (u8 × s8) would do 32 products per instruction but saturates its int16 pair sums
// and needs int8 activations; int16 activations keep 15 bits (the AVX512-VNNI family keeps 7).
//
// Numerics: each activation row is quantized once, by itself, with one scale:
//   s = max|x| / 32767, q = nearbyint(x · (32767 / max|x|)) (ties to even), |q| <= 32767,
//   y[t][o] = f32(Σ_i q[t][i] · w[o][i]) · s[t] · scale[o] + bias[o].
// The sum is exact: a lane adds at most kFlushElements / 16 products of pairs, each at most
// 2 · 128 · 32767 (< 2^31 together), before it is added into a 64-bit total. A row holding a NaN
// or an infinity gives NaN outputs (as f32 products would).
//
// Batch invariance: a row's quantization depends on that row alone and its integer sums are
// exact, so every output is bitwise the same alone or in any batch, in any tile, on any thread.
//
// W8A8 (--precision int8, linear_w8a8_avx2) runs the same tiles at every row count, prefill
// included, on int8 levels from the static input scale (graph/linear.h: quantize_input) held in
// int16 lanes: vpmaddwd's pair sums (at most 2 · 127 · 127) are exact, where vpmaddubsw's u8 × s8
// pairs (up to 2 · 255 · 127) would saturate int16. y = f32(Σ q · w) · s · scale[o] + bias[o],
// up to the bias the AVX512-VNNI family's numbers bit for bit.
#include <immintrin.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/vector_math.h"

namespace kiln::cpu {
namespace {

constexpr float kQMax = 32767.f;
// Elements a lane's int32 sums cover before they go into the 64-bit totals (128 vpmaddwd
// results of at most 2 · 128 · 32767 each: 1.07e9 < 2^31).
constexpr int64_t kFlushElements = 2048;
// Output features per parallel work item (four a tile).
constexpr int64_t kBlock = 16;

// x [k] f32 -> q [kp] int16 (zero past k; kp a multiple of 16); returns the row's scale s
// (NaN when x holds a NaN or an infinity, 0 for a row of zeros).
float quantize_row(const float* x, int64_t k, int16_t* q, int64_t kp) {
  const __m256 sign = _mm256_set1_ps(-0.f), big = _mm256_set1_ps(FLT_MAX);
  __m256 amax = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    const __m256 a = _mm256_andnot_ps(sign, _mm256_loadu_ps(x + i));
    amax = _mm256_max_ps(amax, a);
    bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, big, _CMP_NLE_UQ));
  }
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, amax);
  float m = 0.f;
  for (float l : lanes) m = std::max(m, l);
  bool nonfinite = _mm256_movemask_ps(bad) != 0;
  for (; i < k; ++i) {
    const float a = std::fabs(x[i]);
    nonfinite |= !(a <= FLT_MAX);
    m = std::max(m, a);
  }
  const float inv = m > 0.f ? kQMax / m : 0.f;
  if (nonfinite || !(inv <= FLT_MAX)) {
    // Nothing to quantize: a non-finite row's outputs are NaN; one too small for 32767 / max to
    // be finite (below ~1e-34) gives the bias alone.
    std::fill(q, q + kp, int16_t{0});
    return nonfinite ? std::numeric_limits<float>::quiet_NaN() : 0.f;
  }
  const __m256 vinv = _mm256_set1_ps(inv);
  i = 0;
  for (; i + 16 <= k; i += 16) {
    const __m256i a = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i), vinv));
    const __m256i b = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8), vinv));
    // packs interleaves the 128-bit halves: a0-3 b0-3 a4-7 b4-7 -> a0-7 b0-7.
    const __m256i p = _mm256_permute4x64_epi64(_mm256_packs_epi32(a, b), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), p);
  }
  for (; i < k; ++i) q[i] = static_cast<int16_t>(std::nearbyint(x[i] * inv));
  for (; i < kp; ++i) q[i] = 0;
  return m / kQMax;
}

// The eight int32 lanes added into a 64-bit total (exact, so the order does not matter).
inline int64_t hsum_epi32(__m256i v) {
  alignas(32) int32_t l[8];
  _mm256_store_si256(reinterpret_cast<__m256i*>(l), v);
  int64_t s = 0;
  for (int32_t e : l) s += e;
  return s;
}

// T rows of quantized activations q[t] (padded to a multiple of 16) × four weight rows w[f] of
// k int8 -> exact totals[t][f]. `prefetch` (the first row tile of a group, whose weights stream
// from memory): the next four rows, which follow these in memory, are prefetched as far ahead as
// this group has progressed.
template <int T>
void tile_i8(const int16_t* const* q, const int8_t* const w[4], int64_t k, bool prefetch,
             int64_t totals[][4]) {
  for (int t = 0; t < T; ++t)
    for (int f = 0; f < 4; ++f) totals[t][f] = 0;
  int64_t i = 0;
  while (i + 16 <= k) {
    const int64_t end = std::min(k & ~int64_t{15}, i + kFlushElements);
    __m256i acc[T][4];
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t)
#pragma GCC unroll 4
      for (int f = 0; f < 4; ++f) acc[t][f] = _mm256_setzero_si256();
    for (; i < end; i += 16) {
      if (prefetch) _mm_prefetch(reinterpret_cast<const char*>(w[0] + 4 * k + 4 * i), _MM_HINT_T0);
      __m256i wv[4];
#pragma GCC unroll 4
      for (int f = 0; f < 4; ++f)
        wv[f] = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(w[f] + i)));
#pragma GCC unroll 4
      for (int t = 0; t < T; ++t) {
        const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q[t] + i));
#pragma GCC unroll 4
        for (int f = 0; f < 4; ++f)
          acc[t][f] = _mm256_add_epi32(acc[t][f], _mm256_madd_epi16(xv, wv[f]));
      }
    }
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t)
#pragma GCC unroll 4
      for (int f = 0; f < 4; ++f) totals[t][f] += hsum_epi32(acc[t][f]);
  }
  for (; i < k; ++i)
    for (int t = 0; t < T; ++t)
      for (int f = 0; f < 4; ++f) totals[t][f] += int32_t{q[t][i]} * int32_t{w[f][i]};
}

// x [k] f32 -> q [kp] int16 (zero past k): each element's int8 value with the static scale
// (graph/linear.h: quantize_input), eight lanes at a time.
void quantize_row_static(const float* x, int64_t k, float inv, int16_t* q, int64_t kp) {
  const __m256 vinv = _mm256_set1_ps(inv);
  const __m256 lo = _mm256_set1_ps(-127.f), hi = _mm256_set1_ps(127.f);
  auto levels = [&](const float* p) {
    __m256 v = _mm256_mul_ps(_mm256_loadu_ps(p), vinv);
    v = _mm256_and_ps(v, _mm256_cmp_ps(v, v, _CMP_ORD_Q));  // NaN -> 0
    return _mm256_cvtps_epi32(_mm256_max_ps(_mm256_min_ps(v, hi), lo));
  };
  int64_t i = 0;
  for (; i + 16 <= k; i += 16) {
    const __m256i p =
        _mm256_permute4x64_epi64(_mm256_packs_epi32(levels(x + i), levels(x + i + 8)), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + i), p);
  }
  for (; i < k; ++i) q[i] = quantize_input(x[i], inv);
  for (; i < kp; ++i) q[i] = 0;
}

// Rows of int16 activations q [n, kp] (each row's integer sums times row_scale[t]) × w [m, k]
// i8 -> y [n, m] = f32(Σ q · w) · row_scale[t] · scales[o] + bias[o], then the activation.
void dot_quantized_rows(const Node& node, const int16_t* q, const float* row_scale, int64_t n,
                        int64_t kp, const Tensor& w, const float* scales, const float* bias,
                        float* yp, const KernelEnv& env) {
  const int64_t k = w.dim(1), m = w.dim(0);
  const int8_t* wp = w.data<int8_t>();
  const std::optional<Activation> act = node.attr<LinearAttrs>().epilogue.activation;
  const int64_t blocks = (m + kBlock - 1) / kBlock;
  env.pool.parallel_for(blocks, 1, [&](int64_t b0, int64_t b1) {
    int64_t totals[2][4];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t o0 = b * kBlock, o1 = std::min(m, o0 + kBlock);
      for (int64_t o = o0; o < o1; o += 4) {
        // Rows past the end repeat the last one (their results are dropped).
        const int8_t* rows[4];
        for (int f = 0; f < 4; ++f) rows[f] = wp + std::min(o + f, o1 - 1) * k;
        const int64_t live = std::min<int64_t>(4, o1 - o);
        for (int64_t t = 0; t < n;) {
          const int tn = t + 1 < n ? 2 : 1;
          const int16_t* qs[2] = {q + t * kp, q + (t + tn - 1) * kp};
          if (tn == 2)
            tile_i8<2>(qs, rows, k, t == 0, totals);
          else
            tile_i8<1>(qs, rows, k, t == 0, totals);
          store_linear_tile(yp, m, t, tn, o, live, scales, bias, [&](int j, int64_t f) {
            return static_cast<float>(totals[j][f]) * row_scale[t + j];
          });
          t += tn;
        }
      }
      if (act)
        for (int64_t t = 0; t < n; ++t)
          apply_activation(*act, yp + t * m + o0, yp + t * m + o0, o1 - o0);
    }
  });
}

}  // namespace

// x [n, k] f32, w [m, k] i8, bias [m] (optional), scales [m] -> [n, m] (+ fused activation)
void linear_i8_dot_avx2(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
                        const KernelEnv& env) {
  const Tensor& x = in[0];
  const Tensor& w = in[1];
  const float* bias = in.size() > 2 && in[2].defined() ? in[2].data<float>() : nullptr;
  const float* scales = in.size() > 3 && in[3].defined() ? in[3].data<float>() : nullptr;
  KILN_CHECK(x.dtype() == DType::kF32 && out[0].dtype() == DType::kF32,
             "node '{}': this cpu Linear takes and returns f32 activations", node.name);
  KILN_CHECK(w.dtype() == DType::kI8 && scales != nullptr,
             "node '{}': an i8 weight needs its scales, and only an i8 weight has them", node.name);
  const int64_t k = w.dim(1);
  const int64_t n = x.numel() / k;
  const int64_t kp = (k + 15) / 16 * 16;
  const float* xp = x.data<float>();
  std::vector<int16_t> q(static_cast<size_t>(n * kp));
  std::vector<float> row_scale(static_cast<size_t>(n));
  for (int64_t t = 0; t < n; ++t) row_scale[t] = quantize_row(xp + t * k, k, q.data() + t * kp, kp);
  dot_quantized_rows(node, q.data(), row_scale.data(), n, kp, w, scales, bias, out[0].data<float>(),
                     env);
}

// x [n, k] f32, w [m, k] i8, bias [m] (optional), scales [m], input scale [1] -> [n, m]
// (+ fused activation): W8A8, every row quantized with the static input scale s, so
// y = f32(Σ q · w) · s · scale[o] + bias[o], the integer sums exact.
void linear_w8a8_avx2(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
                      const KernelEnv& env) {
  const Tensor& x = *linear_input(in, LinearOperand::kX);
  const Tensor& w = *linear_input(in, LinearOperand::kWeight);
  const Tensor* bias = linear_input(in, LinearOperand::kBias);
  const Tensor* scales = linear_input(in, LinearOperand::kWeightScales);
  const Tensor* input_scale = linear_input(in, LinearOperand::kInputScale);
  KILN_CHECK(x.dtype() == DType::kF32 && out[0].dtype() == DType::kF32,
             "node '{}': this cpu Linear takes and returns f32 activations", node.name);
  KILN_CHECK(w.dtype() == DType::kI8 && scales != nullptr && input_scale != nullptr,
             "node '{}': a W8A8 Linear needs an i8 weight, its scales and its input scale",
             node.name);
  const float s = input_scale->data<float>()[0];
  KILN_CHECK(std::isfinite(s) && s >= 0.0f,
             "node '{}': the input scale is {}, not a finite non-negative number", node.name, s);
  const int64_t k = w.dim(1);
  const int64_t n = x.numel() / k;
  const int64_t kp = (k + 15) / 16 * 16;
  const float* xp = x.data<float>();
  const float inv = input_inv_scale(s);
  std::vector<int16_t> q(static_cast<size_t>(n * kp));
  const std::vector<float> row_scale(static_cast<size_t>(n), s);
  env.pool.parallel_for(n, 16, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t)
      quantize_row_static(xp + t * k, k, inv, q.data() + t * kp, kp);
  });
  dot_quantized_rows(node, q.data(), row_scale.data(), n, kp, w, scales->data<float>(),
                     bias != nullptr ? bias->data<float>() : nullptr, out[0].data<float>(), env);
}

}  // namespace kiln::cpu
