// RMSNorm (T5), LayerNorm (BLOOM) and the fused residual-add + RMSNorm.
#include <cmath>

#include "backend/cpu/kernels.h"
#include "backend/cpu/simd.h"

namespace kiln::cpu {
namespace {

// Σ x[i]² in fp32: four 8-lane partial sums over 32 elements a step, added in a fixed order,
// then the tail. (One serial sum was a 4-cycle chain per element: 47 us a row block of a
// 78-token flan-t5-base prompt's add + RMSNorm, 1.1 ms of its encoder step.)
float sum_of_squares(const float* x, int64_t d) {
  V8 a0 = {}, a1 = {}, a2 = {}, a3 = {};
  int64_t i = 0;
  for (; i + 32 <= d; i += 32) {
    const V8 x0 = load8(x + i), x1 = load8(x + i + 8), x2 = load8(x + i + 16),
             x3 = load8(x + i + 24);
    a0 += x0 * x0;
    a1 += x1 * x1;
    a2 += x2 * x2;
    a3 += x3 * x3;
  }
  for (; i + 8 <= d; i += 8) {
    const V8 x0 = load8(x + i);
    a0 += x0 * x0;
  }
  float ss = hsum((a0 + a1) + (a2 + a3));
  for (; i < d; ++i) ss += x[i] * x[i];
  return ss;
}

// Σ x[i] (squares: Σ (x[i] - mean)²) in double, as four 4-lane partial sums over 16 elements a
// step added in a fixed order, then the tail. (Two serial double sums a row were ~86 us a
// LayerNorm call in a 78-token bloom-560m prompt, 5 % of its step.)
double sum_in_double(const float* x, int64_t d, double mean, bool squares) {
  typedef double V4d __attribute__((vector_size(32)));
  const V4d m = {mean, mean, mean, mean};
  V4d a[4] = {};
  int64_t i = 0;
  for (; i + 16 <= d; i += 16)
    for (int q = 0; q < 4; ++q) {
      const float* p = x + i + 4 * q;
      V4d v = V4d{p[0], p[1], p[2], p[3]} - m;
      a[q] += squares ? v * v : v;
    }
  const V4d t = (a[0] + a[1]) + (a[2] + a[3]);
  double total = (t[0] + t[2]) + (t[1] + t[3]);
  for (; i < d; ++i) {
    const double v = x[i] - mean;
    total += squares ? v * v : v;
  }
  return total;
}

// T5LayerNorm: variance = mean(x^2) in fp32; x * rsqrt(variance + eps) * w. No mean, no bias.
void rms_row(const float* x, const float* w, float* y, int64_t d, float eps) {
  const float ss = sum_of_squares(x, d);
  const float inv = 1.0f / std::sqrt(ss / static_cast<float>(d) + eps);
  for (int64_t i = 0; i < d; ++i) y[i] = w[i] * (x[i] * inv);
}

}  // namespace

// x [n, d], w [d] -> [n, d]
void rms_norm(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
              const KernelEnv& env) {
  const int64_t d = in[0].dim(-1), n = in[0].numel() / d;
  const float eps = static_cast<float>(node.attr<NormAttrs>().eps);
  env.pool.parallel_for(n, 8, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r)
      rms_row(in[0].data<float>() + r * d, in[1].data<float>(), out[0].data<float>() + r * d, d,
              eps);
  });
}

// x [n, d], w [d], b [d] -> [n, d]; mean and biased variance in fp32 as torch.layer_norm
void layer_norm(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
                const KernelEnv& env) {
  const int64_t d = in[0].dim(-1), n = in[0].numel() / d;
  const float eps = static_cast<float>(node.attr<NormAttrs>().eps);
  const float* w = in[1].data<float>();
  const float* bias = in[2].data<float>();
  env.pool.parallel_for(n, 8, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* x = in[0].data<float>() + r * d;
      float* y = out[0].data<float>() + r * d;
      const double mean = sum_in_double(x, d, 0.0, false) / static_cast<double>(d);
      const double var = sum_in_double(x, d, mean, true) / static_cast<double>(d);
      const float inv = static_cast<float>(1.0 / std::sqrt(var + eps));
      const float m = static_cast<float>(mean);
      for (int64_t i = 0; i < d; ++i) y[i] = (x[i] - m) * inv * w[i] + bias[i];
    }
  });
}

// a [n, d], b [n, d], w [d] -> (a + b, rmsnorm(a + b) * w)
void add_rms_norm(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
                  const KernelEnv& env) {
  const int64_t d = in[0].dim(-1), n = in[0].numel() / d;
  const float eps = static_cast<float>(node.attr<NormAttrs>().eps);
  env.pool.parallel_for(n, 8, [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      const float* x = in[0].data<float>() + r * d;
      const float* y = in[1].data<float>() + r * d;
      float* sum = out[0].data<float>() + r * d;
      for (int64_t i = 0; i < d; ++i) sum[i] = x[i] + y[i];
      rms_row(sum, in[2].data<float>(), out[1].data<float>() + r * d, d, eps);
    }
  });
}

}  // namespace kiln::cpu
