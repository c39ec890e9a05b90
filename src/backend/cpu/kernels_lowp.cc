// Linear and Embedding for weights stored narrower than the f32 activations: bf16, f16 and int8
// with per-output-channel f32 scales (the plans `--precision bf16|fp16|int8-weight` build).
// Weights are widened to f32 in registers and every product is accumulated in f32; int8 rows
// are scaled once, after their dot product.
//
// Batch invariance: an output is always the same fused-multiply-add chain over its row, in index
// order, whatever the number of input rows. Small batches (decode) widen the weights in
// registers as they stream them; larger ones widen four weight rows once into a scratch buffer
// and run the very same chain over it (widening is exact), so both paths give the same bits.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <type_traits>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/onednn_bf16.h"
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

// From this many input rows on, four weight rows are widened once into scratch and reused by
// every row (the products are the same; only the widening work is shared).
constexpr int64_t kWidenOnceRows = 4;
// Output features per parallel work item.
constexpr int64_t kBlock = 16;

// From this many input rows (prefill), bf16 plans multiply through oneDNN's bf16 matmul: the
// activations are rounded to bf16 (as bf16 inference does; accumulation stays f32), and a row's
// result may then differ in the last bits with the rows around it, as in the fp32 sgemm path.
constexpr int64_t kBf16GemmRows = 64;

// x [n, k] f32, w [m, k] bf16 -> y [n, m]: x rounded to bf16 once, then one single-threaded
// oneDNN matmul per pool thread on its slice of the output features, then bias and activation.
void linear_bf16_gemm(const float* xp, int64_t n, int64_t k, const uint16_t* wp, int64_t m,
                      const float* bias, std::optional<Activation> act, float* yp,
                      const KernelEnv& env) {
  std::vector<uint16_t> xb(static_cast<size_t>(n * k));
  env.pool.parallel_for(n, 8, [&](int64_t r0, int64_t r1) {
    for (int64_t i = r0 * k; i < r1 * k; ++i) xb[i] = float_to_bf16(xp[i]);
  });
  constexpr int64_t kAlign = 64;
  env.pool.parallel_for((m + kAlign - 1) / kAlign, 1, [&](int64_t c0, int64_t c1) {
    const int64_t o0 = c0 * kAlign, o1 = std::min(m, c1 * kAlign);
    onednn_matmul_bf16(xb.data(), n, k, wp + o0 * k, o1 - o0, yp + o0, m);
    for (int64_t t = 0; t < n; ++t) {
      float* yr = yp + t * m;
      if (bias)
        for (int64_t o = o0; o < o1; ++o) yr[o] += bias[o];
      if (act) apply_activation(*act, yr + o0, yr + o0, o1 - o0);
    }
  });
}

template <class W>
struct Dot4 {
  void (*narrow)(const float*, const typename W::T* const*, int64_t, float*);
  void (*wide)(const float*, const float* const*, int64_t, float*);
};

// x [n, k], w [m, k] of W, bias [m] (optional), scales [m] (i8) -> [n, m] (+ fused activation)
template <class W>
void linear_narrow(Dot4<W> dot, const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
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
  const std::optional<Activation> act = node.attr<LinearAttrs>().activation;
  if constexpr (std::is_same_v<W, Bf16Weights>) {
    if (n >= kBf16GemmRows && !onednn_bf16_matmul_impl().empty()) {
      linear_bf16_gemm(xp, n, k, wp, m, bias, act, yp, env);
      return;
    }
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
        const float* wide[4];
        if (widen_once) {
          for (int r = 0; r < 4; ++r) {
            float* dst = scratch.data() + r * k;
            for (int64_t i = 0; i < k; ++i) dst[i] = W::one(rows[r][i]);
            wide[r] = dst;
          }
        }
        for (int64_t t = 0; t < n; ++t) {
          float s[4];
          if (widen_once)
            dot.wide(xp + t * k, wide, k, s);
          else
            dot.narrow(xp + t * k, rows, k, s);
          float* yr = yp + t * m;
          for (int64_t r = 0; r < live; ++r) {
            float v = s[r];
            if (scales) v *= scales[o + r];
            if (bias) v += bias[o + r];
            yr[o + r] = v;
          }
        }
      }
      if (act)
        for (int64_t t = 0; t < n; ++t)
          apply_activation(*act, yp + t * m + o0, yp + t * m + o0, o1 - o0);
    }
  });
}

template <class W>
constexpr Dot4<W> avx2_dots() {
  return {dot4_avx2<W>, dot4_avx2<F32Weights>};
}

// y[i] = x[i * stride], i < n: a row of a panel-packed table, element by element as words (a
// byte copy per element took 3 ms of a 1248-token bloom-560m prompt).
void copy_strided(const uint16_t* x, int64_t stride, uint16_t* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = x[i * stride];
}

}  // namespace

void linear_bf16_avx2(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
                      const KernelEnv& env) {
  linear_narrow<Bf16Weights>(avx2_dots<Bf16Weights>(), node, in, out, env);
}
void linear_f16_avx2(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
                     const KernelEnv& env) {
  linear_narrow<F16Weights>(avx2_dots<F16Weights>(), node, in, out, env);
}
void linear_i8_avx2(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
                    const KernelEnv& env) {
  linear_narrow<I8Weights>(avx2_dots<I8Weights>(), node, in, out, env);
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
