// Embedding, Linear and GatherRows.
#include <algorithm>
#include <cstring>
#include <optional>

#include <omp.h>
#include <oneapi/dnnl/dnnl.h>

#include "backend/cpu/kernels.h"
#include "backend/cpu/simd.h"
#include "backend/cpu/vector_math.h"
#include "graph/packing.h"

namespace kiln::cpu {

namespace {

// The AVX2 Linear as dot products: every output (token t, feature o) is the lane-wise partial sums
// of x[t] · w[o] over k in index order, the lanes added in a fixed order, then the elements past
// the last full vector. A kernel computes a tile of T tokens × 4 features at once (sharing the
// loads of x and w), but that order never changes with the tile, the batch or the thread count, so
// an output depends only on its own row and weight row — never on the batch around it.

// The tail past the last full vector, added after the lane sum (the same for every tile shape).
inline float finish_dot(const float* x, const float* w, int64_t i, int64_t n, float s) {
  for (; i < n; ++i) s += x[i] * w[i];
  return s;
}

// Eight lanes (AVX2, the build's baseline): 2 tokens × 4 features = 8 accumulators, which with
// the loads fit the 16 ymm registers.
template <int T>
void tile_avx2(const float* const* x, const float* w, int64_t ldw, int64_t k, float* y,
               int64_t ldy) {
  V8 acc[T][4] = {};
  int64_t i = 0;
  for (; i + 8 <= k; i += 8) {
    if (i % 16 ==
        0)  // the next four rows, a cache line ahead: a row group's rows start on new pages
      for (int o = 4; o < 8; ++o) __builtin_prefetch(w + o * ldw + i);
    const V8 w0 = load8(w + i), w1 = load8(w + ldw + i), w2 = load8(w + 2 * ldw + i),
             w3 = load8(w + 3 * ldw + i);
    for (int t = 0; t < T; ++t) {
      const V8 xv = load8(x[t] + i);
      acc[t][0] += xv * w0;
      acc[t][1] += xv * w1;
      acc[t][2] += xv * w2;
      acc[t][3] += xv * w3;
    }
  }
  for (int t = 0; t < T; ++t)
    for (int o = 0; o < 4; ++o)
      y[t * ldy + o] = finish_dot(x[t], w + o * ldw, i, k, hsum(acc[t][o]));
}

// One tile shape per call: T tokens (1..kMaxTile) × 4 weight rows ldw floats apart.
using TileFn = void (*)(const float* const*, const float*, int64_t, int64_t, float*, int64_t);
constexpr int kMaxTile = 2;
struct Tiles {
  int max_tokens;
  TileFn fn[kMaxTile + 1];
};
const Tiles kAvx2Tiles{2, {nullptr, tile_avx2<1>, tile_avx2<2>}};

// From this many rows (prefill) oneDNN's GEMM is faster than the tiles (measured with
// bench/micro/linear_bench.cc on one AVX-512 core: 130 vs 108 GFLOP/s at 78 rows, 172 vs 93 at
// 512; at 4-16 rows the tiles win, 72-96 vs 42-58). Below it a row's result never depends on the
// batch; at and above it oneDNN's blocking may change the last bits with the number of rows.
constexpr int64_t kGemmRows = 64;

// x [n, in], w [out, in], bias [out] -> [n, out] (+ fused activation)
void linear_with(const Tiles& tiles, const Node& node, std::span<const Tensor> in,
                 std::span<Tensor> out, const KernelEnv& env) {
  const Tensor& x = in[0];
  const Tensor& w = in[1];
  const float* bias = in.size() > 2 && in[2].defined() ? in[2].data<float>() : nullptr;
  KILN_CHECK(w.dtype() == DType::kF32, "node '{}': cpu Linear needs f32 weights, got {}", node.name,
             dtype_name(w.dtype()));
  const int64_t k = w.dim(1), m = w.dim(0);
  const int64_t n = x.numel() / k;
  const float* xp = x.data<float>();
  const float* wp = w.data<float>();
  float* yp = out[0].data<float>();
  const std::optional<Activation> act = node.attr<LinearAttrs>().epilogue.activation;
  const auto epilogue = [&](int64_t t, int64_t o0, int64_t o1) {
    if (bias == nullptr && !act) return;
    float* yr = yp + t * m;
    if (bias)
      for (int64_t o = o0; o < o1; ++o) yr[o] += bias[o];
    if (act) apply_activation(*act, yr + o0, yr + o0, o1 - o0);
  };
  if (n >= kGemmRows) {
    // Prefill: oneDNN's GEMM, one single-threaded call per pool thread on its own slice of the
    // output features (so no OpenMP team runs beside the pool), then bias and activation.
    constexpr int64_t kAlign = 64;
    env.pool.parallel_for((m + kAlign - 1) / kAlign, 1, [&](int64_t c0, int64_t c1) {
      const int64_t o0 = c0 * kAlign, o1 = std::min(m, c1 * kAlign);
      omp_set_num_threads(1);
      const dnnl_status_t st =
          dnnl_sgemm('N', 'T', n, o1 - o0, k, 1.f, xp, k, wp + o0 * k, k, 0.f, yp + o0, m);
      KILN_CHECK(st == dnnl_success, "node '{}': oneDNN sgemm failed (status {})", node.name,
                 static_cast<int>(st));
      for (int64_t t = 0; t < n; ++t) epilogue(t, o0, o1);
    });
    return;
  }
  // Blocks of output features: each block's weight rows stay in cache while every input row
  // passes over them; for one token (decode) the weights stream once through both cores.
  constexpr int64_t kBlock = 16;
  const int64_t blocks = (m + kBlock - 1) / kBlock;
  env.pool.parallel_for(blocks, 1, [&](int64_t b0, int64_t b1) {
    float scratch[kMaxTile * 4];
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t o0 = b * kBlock, o1 = std::min(m, o0 + kBlock);
      for (int64_t t = 0; t < n;) {
        const int tn = static_cast<int>(std::min<int64_t>(tiles.max_tokens, n - t));
        const float* xs[kMaxTile];
        for (int j = 0; j < tn; ++j) xs[j] = xp + (t + j) * k;
        int64_t o = o0;
        for (; o + 4 <= o1; o += 4) tiles.fn[tn](xs, wp + o * k, k, k, yp + t * m + o, m);
        for (; o < o1; ++o) {
          // A lone feature: the tile with its weight row four times (ldw 0), same order.
          tiles.fn[tn](xs, wp + o * k, 0, k, scratch, 4);
          for (int j = 0; j < tn; ++j) yp[(t + j) * m + o] = scratch[j * 4];
        }
        t += tn;
      }
      for (int64_t t = 0; t < n; ++t) epilogue(t, o0, o1);
    }
  });
}

}  // namespace

// table [vocab, d], ids [n] -> [n, d]
void embedding(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
               const KernelEnv& env) {
  const Tensor& table = in[0];
  const Tensor& ids = in[1];
  Tensor& y = out[0];
  const int64_t vocab = table.dim(0), d = table.dim(1), n = ids.dim(0);
  KILN_CHECK(table.dtype() == DType::kF32, "node '{}': embedding table must be f32 on cpu",
             node.name);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t id = ids.dtype() == DType::kI64 ? ids.data<int64_t>()[t] : ids.data<int32_t>()[t];
    KILN_CHECK(id >= 0 && id < vocab, "node '{}': token id {} is outside the vocabulary [0, {})",
               node.name, id, vocab);
    if (!env.packed_weight) {
      std::memcpy(y.data<float>() + t * d, table.data<float>() + id * d, d * sizeof(float));
      continue;
    }
    // A table packed for the Linear it is shared with (BLOOM's tied lm_head): the row's
    // elements are a panel's width apart.
    const float* src = table.data<float>() + panel16_offset(vocab, d, id, 0);
    const int64_t stride = panel16_offset(vocab, d, id, 1) - panel16_offset(vocab, d, id, 0);
    float* dst = y.data<float>() + t * d;
    for (int64_t i = 0; i < d; ++i) dst[i] = src[i * stride];
  }
}

// x [n, in], w [out, in], bias [out] -> [n, out] (+ fused activation): the AVX2 baseline (the
// AVX-512 Linear is kernels_packed.cc); sums in a fixed order per output.
void linear_avx2(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
                 const KernelEnv& env) {
  linear_with(kAvx2Tiles, node, in, out, env);
}

// x [n, d], rows [r] -> [r, d]
void gather_rows(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
                 const KernelEnv&) {
  const Tensor& x = in[0];
  const Tensor& rows = in[1];
  const int64_t n = x.dim(0), d = x.dim(1), r = rows.dim(0);
  const size_t row_bytes = dtype_bytes(x.dtype(), static_cast<size_t>(d));
  for (int64_t i = 0; i < r; ++i) {
    const int64_t src = rows.data<int64_t>()[i];
    KILN_CHECK(src >= 0 && src < n, "node '{}': row {} out of range [0, {})", node.name, src, n);
    std::memcpy(static_cast<char*>(out[0].raw()) + i * row_bytes,
                static_cast<const char*>(x.raw()) + src * row_bytes, row_bytes);
  }
}

}  // namespace kiln::cpu
