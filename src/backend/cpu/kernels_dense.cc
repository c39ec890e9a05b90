// Embedding, Linear and GatherRows.
#include <algorithm>
#include <cstring>
#include <optional>

#include "backend/cpu/kernels.h"
#include "backend/cpu/simd.h"

namespace kiln::cpu {

namespace {

// Eight float lanes (AVX2, the build's baseline). Every dot product below sums lane-wise partials
// in index order and then the lanes in a fixed order, so an output depends only on its own row
// and weight row — never on the batch around it.

// Adds the elements past the last full vector to the four lane sums and stores them. Shared by
// both kernel families (a function without a target attribute inlines into either).
inline void finish_dot4(const float* x, const float* w0, const float* w1, const float* w2,
                        const float* w3, int64_t i, int64_t n, float s0, float s1, float s2,
                        float s3, float out[4]) {
  for (; i < n; ++i) {
    s0 += x[i] * w0[i];
    s1 += x[i] * w1[i];
    s2 += x[i] * w2[i];
    s3 += x[i] * w3[i];
  }
  out[0] = s0;
  out[1] = s1;
  out[2] = s2;
  out[3] = s3;
}

// Four dot products of x against w0..w3 sharing the loads of x.
void dot4_avx2(const float* x, const float* w0, const float* w1, const float* w2, const float* w3,
               int64_t n, float out[4]) {
  V8 a0 = {}, a1 = {}, a2 = {}, a3 = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const V8 xv = load8(x + i);
    a0 += xv * load8(w0 + i);
    a1 += xv * load8(w1 + i);
    a2 += xv * load8(w2 + i);
    a3 += xv * load8(w3 + i);
  }
  finish_dot4(x, w0, w1, w2, w3, i, n, hsum(a0), hsum(a1), hsum(a2), hsum(a3), out);
}

// The same four dot products with sixteen lanes, for CPUs with AVX-512 (chosen at run time;
// the build's baseline stays x86-64-v3).
#define KILN_TARGET_AVX512 __attribute__((target("avx512f,avx512vl,avx2,fma")))
typedef float V16 __attribute__((vector_size(64)));
typedef float V16Unaligned __attribute__((vector_size(64), aligned(4), may_alias));

KILN_TARGET_AVX512 inline float hsum16(V16 v) {
  const float lo = ((v[0] + v[8]) + (v[1] + v[9])) + ((v[2] + v[10]) + (v[3] + v[11]));
  const float hi = ((v[4] + v[12]) + (v[5] + v[13])) + ((v[6] + v[14]) + (v[7] + v[15]));
  return lo + hi;
}

KILN_TARGET_AVX512 void dot4_avx512(const float* x, const float* w0, const float* w1,
                                    const float* w2, const float* w3, int64_t n, float out[4]) {
  V16 a0 = {}, a1 = {}, a2 = {}, a3 = {};
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const V16 xv = *reinterpret_cast<const V16Unaligned*>(x + i);
    a0 += xv * *reinterpret_cast<const V16Unaligned*>(w0 + i);
    a1 += xv * *reinterpret_cast<const V16Unaligned*>(w1 + i);
    a2 += xv * *reinterpret_cast<const V16Unaligned*>(w2 + i);
    a3 += xv * *reinterpret_cast<const V16Unaligned*>(w3 + i);
  }
  finish_dot4(x, w0, w1, w2, w3, i, n, hsum16(a0), hsum16(a1), hsum16(a2), hsum16(a3), out);
}

using Dot4 = void (*)(const float*, const float*, const float*, const float*, const float*, int64_t,
                      float*);

// x [n, in], w [out, in], bias [out] -> [n, out] (+ fused activation)
void linear_with(Dot4 dot4, const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
                 const KernelEnv& env) {
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
  const std::optional<Activation> act = node.attr<LinearAttrs>().activation;
  // Blocks of output features: each block's weight rows stay in cache while every input row
  // passes over them.
  constexpr int64_t kBlock = 16;
  const int64_t blocks = (m + kBlock - 1) / kBlock;
  env.pool.parallel_for(blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t o0 = b * kBlock, o1 = std::min(m, o0 + kBlock);
      for (int64_t t = 0; t < n; ++t) {
        const float* xr = xp + t * k;
        float* yr = yp + t * m;
        int64_t o = o0;
        for (; o + 4 <= o1; o += 4) {
          const float* w = wp + o * k;
          dot4(xr, w, w + k, w + 2 * k, w + 3 * k, k, yr + o);
        }
        for (; o < o1; ++o) {
          float s[4];
          const float* w = wp + o * k;
          dot4(xr, w, w, w, w, k, s);  // same summation order as the 4-wide path
          yr[o] = s[0];
        }
        for (o = o0; o < o1; ++o) {
          float v = yr[o];
          if (bias) v += bias[o];
          if (act) v = apply_activation(*act, v);
          yr[o] = v;
        }
      }
    }
  });
}

}  // namespace

// table [vocab, d], ids [n] -> [n, d]
void embedding(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
               const KernelEnv&) {
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
    std::memcpy(y.data<float>() + t * d, table.data<float>() + id * d, d * sizeof(float));
  }
}

// x [n, in], w [out, in], bias [out] -> [n, out] (+ fused activation). Two families chosen at
// compile time through the kernel registry; both sum in a fixed order per output.
void linear_avx2(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
                 const KernelEnv& env) {
  linear_with(dot4_avx2, node, in, out, env);
}

void linear_avx512(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
                   const KernelEnv& env) {
  linear_with(dot4_avx512, node, in, out, env);
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
