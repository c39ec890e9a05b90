// Embedding, Linear and GatherRows.
#include <algorithm>
#include <cstring>

#include "backend/cpu/kernels.h"

namespace kiln::cpu {

float dot(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

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

// x [n, in], w [out, in], bias [out] -> [n, out] (+ fused activation)
void linear(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
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
  const bool act = node.attrs.has_activation;
  const Activation a = node.attrs.activation;
  // Blocks of output features: each block's weight rows stay in cache while every input row
  // passes over them.
  constexpr int64_t kBlock = 16;
  const int64_t blocks = (m + kBlock - 1) / kBlock;
  env.pool.parallel_for(blocks, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t o0 = b * kBlock, o1 = std::min(m, o0 + kBlock);
      for (int64_t t = 0; t < n; ++t) {
        const float* xr = xp + t * k;
        for (int64_t o = o0; o < o1; ++o) {
          float v = dot(xr, wp + o * k, k);
          if (bias) v += bias[o];
          if (act) v = apply_activation(a, v);
          yp[t * m + o] = v;
        }
      }
    }
  });
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
