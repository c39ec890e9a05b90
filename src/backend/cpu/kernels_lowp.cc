// Linear and Embedding for weights stored narrower than the f32 activations: bf16, f16 and int8
// with per-output-channel f32 scales (the plans `--precision bf16|fp16|int8-weight` build), in the
// AVX2 family (the AVX-512 Linear is kernels_packed.cc).
//
// Below kGemmRows rows, bf16 and f16 weights are widened to f32 and every product is accumulated
// in f32 (AVX2 has no bf16 or f16 products); i8 weights take integer dot products there
// (kernels_lowp_int8.cc). From kGemmRows rows (prefill) every narrow dtype is widened and
// multiplied by oneDNN's f32 sgemm (see kGemmRows).
//
// Batch invariance below kGemmRows: an output is always the same fused-multiply-add chain over
// its row, in index order, whatever the number of input rows. Small batches (decode) widen the
// weights in registers as they stream them; larger ones widen four weight rows once into a
// scratch buffer and run the very same chains over it in 2-row tiles (widening is exact), so
// both paths give the same bits.
#include <immintrin.h>
#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/vector_math.h"
#include "core/half.h"
#include "graph/packing.h"

namespace kiln::cpu {
namespace {

// Weight formats: how 8 elements and a single element widen to f32 (the AVX2 baseline; the
// AVX-512 Linear is kernels_packed.cc).
struct F32Weights {
  using T = float;
  static __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
  static float one(float v) { return v; }
};
struct Bf16Weights {
  using T = uint16_t;
  static __m256 load8(const uint16_t* p) {
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static float one(uint16_t v) { return bf16_to_float(v); }
};
struct F16Weights {
  using T = uint16_t;
  static __m256 load8(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static float one(uint16_t v) { return fp16_to_float(v); }
};
struct I8Weights {
  using T = int8_t;
  static __m256 load8(const int8_t* p) {
    const __m128i q = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p));
    return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(q));
  }
  static float one(int8_t v) { return static_cast<float>(v); }
};

// Lanes summed in a fixed order.
inline float hsum8(__m256 v) {
  alignas(32) float l[8];
  _mm256_store_ps(l, v);
  return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

// The elements past the last full vector, added to the lane sums with explicit fmas so that
// every instantiation rounds alike.
template <class W>
inline void finish4(const float* x, const typename W::T* const w[4], int64_t i, int64_t k,
                    float s[4]) {
  for (; i < k; ++i)
    for (int r = 0; r < 4; ++r) s[r] = std::fma(x[i], W::one(w[r][i]), s[r]);
}

// Streaming weights from memory (batch-1 decode), the four rows of the next group, which follow
// these four in memory, are prefetched as far ahead as this group has progressed: the hardware
// prefetcher alone stops at every 4 KiB page, and narrow rows are only a page or two long.
template <class W>
inline void prefetch_next_group(const typename W::T* const w[4], int64_t k, int64_t i) {
  if constexpr (!std::is_same_v<W, F32Weights>)
    _mm_prefetch(reinterpret_cast<const char*>(w[0] + 4 * k + 4 * i), _MM_HINT_T0);
}

// Four dot products x·w[r] over k elements (x shared).
template <class W>
void dot4_avx2(const float* x, const typename W::T* const w[4], int64_t k, float out[4]) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    prefetch_next_group<W>(w, k, i);
    const __m256 xv = _mm256_loadu_ps(x + i);
    a0 = _mm256_fmadd_ps(xv, W::load8(w[0] + i), a0);
    a1 = _mm256_fmadd_ps(xv, W::load8(w[1] + i), a1);
    a2 = _mm256_fmadd_ps(xv, W::load8(w[2] + i), a2);
    a3 = _mm256_fmadd_ps(xv, W::load8(w[3] + i), a3);
  }
  out[0] = hsum8(a0);
  out[1] = hsum8(a1);
  out[2] = hsum8(a2);
  out[3] = hsum8(a3);
  finish4<W>(x, w, i, k, out);
}

// T input rows × the four weight rows widened once (f32 scratch): the same lane chains, lane
// sums and tail as dot4_avx2, so each output is bitwise what dot4_avx2 gives for its row alone.
//
// `prefetch` (the first row tile of a group): the next four narrow rows, which follow these in
// memory, are fetched while this tile runs, so that widening them does not wait on memory.
template <class W, int T>
void tile_wide(const float* const* x, const float* const w[4], const typename W::T* const narrow[4],
               int64_t k, bool prefetch, float* y, int64_t ldy) {
  __m256 acc[T][4];
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t)
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) acc[t][r] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    if (prefetch) prefetch_next_group<W>(narrow, k, i);
    const __m256 w0 = _mm256_loadu_ps(w[0] + i), w1 = _mm256_loadu_ps(w[1] + i),
                 w2 = _mm256_loadu_ps(w[2] + i), w3 = _mm256_loadu_ps(w[3] + i);
#pragma GCC unroll 4
    for (int t = 0; t < T; ++t) {
      const __m256 xv = _mm256_loadu_ps(x[t] + i);
      acc[t][0] = _mm256_fmadd_ps(xv, w0, acc[t][0]);
      acc[t][1] = _mm256_fmadd_ps(xv, w1, acc[t][1]);
      acc[t][2] = _mm256_fmadd_ps(xv, w2, acc[t][2]);
      acc[t][3] = _mm256_fmadd_ps(xv, w3, acc[t][3]);
    }
  }
#pragma GCC unroll 4
  for (int t = 0; t < T; ++t) {
    float s[4];
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) s[r] = hsum8(acc[t][r]);
    finish4<W>(x[t], narrow, i, k, s);
    for (int r = 0; r < 4; ++r) y[t * ldy + r] = s[r];
  }
}

// rows [4][k] of W widened to f32 into dst [4][k] (exact).
template <class W>
void widen4(const typename W::T* const rows[4], int64_t k, float* dst) {
  for (int r = 0; r < 4; ++r) {
    float* d = dst + r * k;
    int64_t i = 0;
    for (; i + 8 <= k; i += 8) _mm256_storeu_ps(d + i, W::load8(rows[r] + i));
    for (; i < k; ++i) d[i] = W::one(rows[r][i]);
  }
}

// From this many input rows on, four weight rows are widened once into scratch and reused by
// every row (the products are the same; only the widening work is shared), two rows a tile.
constexpr int64_t kWidenOnceRows = 4;
// Output features per parallel work item.
constexpr int64_t kBlock = 16;

// From this many input rows (prefill) narrow weights are widened to f32, 64 output features at a
// time, and multiplied by oneDNN's f32 sgemm, as the fp32 Linear does from the same row count
// (kernels_dense.cc): a row's result may then differ in the last bits with the rows around it.
// This is the one prefill path of the AVX2 family for every narrow dtype, chosen deliberately:
// AVX2 has no bf16 or f16 products, oneDNN (2.x) has no bf16 matmul without AVX-512 (creating
// one fails with "unimplemented"), and widening costs one pass over a slice of the weights
// against the prompt's rows of FMAs over it. kiln's own tiles at these sizes were 1.5-2.3×
// slower than the fp32 sgemm (bloom-560m prompt of 78 tokens: bf16 569 ms, fp16 844 ms, fp32
// 365 ms; 2026-12-05, forced AVX2 on the Zen 5 VM; bf16 312-318 ms after).
constexpr int64_t kGemmRows = 64;
constexpr int64_t kGemmSlice = 64;

// x [n, k] f32, w [m, k] of W -> y [n, m] (× scales, + bias, activation).
template <class W>
void linear_widened_gemm(const float* xp, int64_t n, int64_t k, const typename W::T* wp, int64_t m,
                         const float* scales, const float* bias, std::optional<Activation> act,
                         float* yp, const KernelEnv& env, const Node& node) {
  env.pool.parallel_for((m + kGemmSlice - 1) / kGemmSlice, 1, [&](int64_t c0, int64_t c1) {
    std::vector<float> wide(static_cast<size_t>(std::min(m, kGemmSlice) * k));
    omp_set_num_threads(1);
    for (int64_t c = c0; c < c1; ++c) {
      const int64_t o0 = c * kGemmSlice, o1 = std::min(m, o0 + kGemmSlice);
      const typename W::T* src = wp + o0 * k;
      const int64_t count = (o1 - o0) * k;
      int64_t i = 0;
      for (; i + 8 <= count; i += 8) _mm256_storeu_ps(wide.data() + i, W::load8(src + i));
      for (; i < count; ++i) wide[i] = W::one(src[i]);
      const dnnl_status_t st =
          dnnl_sgemm('N', 'T', n, o1 - o0, k, 1.f, xp, k, wide.data(), k, 0.f, yp + o0, m);
      KILN_CHECK(st == dnnl_success, "node '{}': oneDNN sgemm failed (status {})", node.name,
                 static_cast<int>(st));
      for (int64_t t = 0; t < n; ++t) {
        float* yr = yp + t * m;
        if (scales)
          for (int64_t o = o0; o < o1; ++o) yr[o] *= scales[o];
        if (bias)
          for (int64_t o = o0; o < o1; ++o) yr[o] += bias[o];
        if (act) apply_activation(*act, yr + o0, yr + o0, o1 - o0);
      }
    }
  });
}

// x [n, k], w [m, k] of W, bias [m] (optional), scales [m] (i8) -> [n, m] (+ fused activation)
template <class W>
void linear_narrow(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
                   const KernelEnv& env) {
  using T = typename W::T;
  const Tensor& x = in[0];
  const Tensor& w = in[1];
  const float* bias = in.size() > 2 && in[2].defined() ? in[2].data<float>() : nullptr;
  const float* scales = in.size() > 3 && in[3].defined() ? in[3].data<float>() : nullptr;
  KILN_CHECK(x.dtype() == DType::kF32 && out[0].dtype() == DType::kF32,
             "node '{}': this cpu Linear takes and returns f32 activations", node.name);
  KILN_CHECK((w.dtype() == DType::kI8) == (scales != nullptr),
             "node '{}': an i8 weight needs its scales, and only an i8 weight has them", node.name);
  const int64_t k = w.dim(1), m = w.dim(0);
  const int64_t n = x.numel() / k;
  const float* xp = x.data<float>();
  const T* wp = static_cast<const T*>(w.raw());
  float* yp = out[0].data<float>();
  const std::optional<Activation> act = node.attr<LinearAttrs>().epilogue.activation;
  if (n >= kGemmRows) {
    linear_widened_gemm<W>(xp, n, k, wp, m, scales, bias, act, yp, env, node);
    return;
  }
  const bool widen_once = n >= kWidenOnceRows;
  const int64_t blocks = (m + kBlock - 1) / kBlock;
  env.pool.parallel_for(blocks, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> scratch(widen_once ? static_cast<size_t>(4 * k) : 0);
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t o0 = b * kBlock, o1 = std::min(m, o0 + kBlock);
      for (int64_t o = o0; o < o1; o += 4) {
        // Rows past the end repeat the last one (their results are dropped).
        const T* rows[4];
        for (int r = 0; r < 4; ++r) rows[r] = wp + std::min(o + r, o1 - 1) * k;
        const int64_t live = std::min<int64_t>(4, o1 - o);
        const float* wide[4] = {};
        if (widen_once) {
          widen4<W>(rows, k, scratch.data());
          for (int r = 0; r < 4; ++r) wide[r] = scratch.data() + r * k;
        }
        float s[2][4];
        for (int64_t t = 0; t < n;) {
          const int tn = widen_once && t + 1 < n ? 2 : 1;
          if (widen_once) {
            const float* xs[2] = {xp + t * k, xp + (t + tn - 1) * k};
            if (tn == 2)
              tile_wide<W, 2>(xs, wide, rows, k, t == 0, s[0], 4);
            else
              tile_wide<W, 1>(xs, wide, rows, k, t == 0, s[0], 4);
          } else {
            dot4_avx2<W>(xp + t * k, rows, k, s[0]);
          }
          store_linear_tile(yp, m, t, tn, o, live, scales, bias,
                            [&](int j, int64_t r) { return s[j][r]; });
          t += tn;
        }
      }
      if (act)
        for (int64_t t = 0; t < n; ++t)
          apply_activation(*act, yp + t * m + o0, yp + t * m + o0, o1 - o0);
    }
  });
}

// y[i] = x[i * stride], i < n: a row of a panel-packed table, element by element as words (a
// byte copy per element took 3 ms of a 1248-token bloom-560m prompt).
void copy_strided(const uint16_t* x, int64_t stride, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i * stride];
}

}  // namespace

void linear_bf16_avx2(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
                      const KernelEnv& env) {
  linear_narrow<Bf16Weights>(node, in, out, env);
}
void linear_f16_avx2(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
                     const KernelEnv& env) {
  linear_narrow<F16Weights>(node, in, out, env);
}
void linear_i8_avx2(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
                    const KernelEnv& env) {
  // Below the prefill's row count: integer dot products (kernels_lowp_int8.cc).
  const int64_t k = in[1].dim(1);
  if (in[0].numel() / k < kGemmRows) {
    linear_i8_dot_avx2(node, in, out, env);
    return;
  }
  linear_narrow<I8Weights>(node, in, out, env);
}

// table [vocab, d] of bf16 / f16, ids [n] -> [n, d] of the table's dtype (rows copied; the
// precision pass widens them with a Cast). i8 tables: scales [vocab], rows come out f32.
void embedding_narrow(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
                      const KernelEnv& env) {
  const Tensor& table = in[0];
  const Tensor& ids = in[1];
  Tensor& y = out[0];
  const int64_t vocab = table.dim(0), d = table.dim(1), n = ids.dim(0);
  const bool quantized = table.dtype() == DType::kI8;
  KILN_CHECK(quantized == (in.size() > 2 && in[2].defined()),
             "node '{}': an i8 embedding table needs its scales, and only an i8 table has them",
             node.name);
  KILN_CHECK(quantized ? y.dtype() == DType::kF32 : y.dtype() == table.dtype(),
             "node '{}': embedding output {} does not fit a {} table", node.name,
             dtype_name(y.dtype()), dtype_name(table.dtype()));
  const size_t elem = dtype_bytes(table.dtype(), 1);
  const char* base = static_cast<const char*>(table.raw());
  for (int64_t t = 0; t < n; ++t) {
    const int64_t id = ids.dtype() == DType::kI64 ? ids.data<int64_t>()[t] : ids.data<int32_t>()[t];
    KILN_CHECK(id >= 0 && id < vocab, "node '{}': token id {} is outside the vocabulary [0, {})",
               node.name, id, vocab);
    // Row id's elements: contiguous, or a panel's width apart in a table packed for the Linear
    // it is shared with (BLOOM's tied lm_head).
    const int64_t first = env.packed_weight ? panel16_offset(vocab, d, id, 0) : id * d;
    const int64_t stride = env.packed_weight ? panel16_offset(vocab, d, id, 1) - first : 1;
    if (!quantized) {
      char* dst = static_cast<char*>(y.raw()) + static_cast<size_t>(t * d) * elem;
      const char* src = base + static_cast<size_t>(first) * elem;
      if (stride == 1)
        std::memcpy(dst, src, static_cast<size_t>(d) * elem);
      else  // the unquantized tables registered here are bf16 or f16: a copy of 2-byte words
        copy_strided(reinterpret_cast<const uint16_t*>(src), stride,
                     reinterpret_cast<uint16_t*>(dst), d);
      continue;
    }
    const int8_t* q = table.data<int8_t>() + first;
    const float scale = in[2].data<float>()[id];
    float* yr = y.data<float>() + t * d;
    for (int64_t i = 0; i < d; ++i) yr[i] = static_cast<float>(q[i * stride]) * scale;
  }
}

}  // namespace kiln::cpu
