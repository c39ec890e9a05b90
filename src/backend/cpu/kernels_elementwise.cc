// Elementwise ops, activations, softmax and casts.
#include <algorithm>
#include <cmath>

#include "backend/cpu/kernels.h"
#include "backend/cpu/simd.h"
#include "backend/cpu/vector_math.h"

namespace kiln::cpu {

namespace {
template <typename F>
void map_rows(const KernelEnv& env, int64_t total, F&& f) {
  env.pool.parallel_for(total, 16384, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) f(i);
  });
}
}  // namespace

void add(const Node&, std::span<const Tensor> in, std::span<Tensor> out, const KernelEnv& env) {
  const float* a = in[0].data<float>();
  const float* b = in[1].data<float>();
  float* y = out[0].data<float>();
  map_rows(env, in[0].numel(), [&](int64_t i) { y[i] = a[i] + b[i]; });
}

void mul(const Node&, std::span<const Tensor> in, std::span<Tensor> out, const KernelEnv& env) {
  const float* a = in[0].data<float>();
  const float* b = in[1].data<float>();
  float* y = out[0].data<float>();
  map_rows(env, in[0].numel(), [&](int64_t i) { y[i] = a[i] * b[i]; });
}

void scale(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
           const KernelEnv& env) {
  const float* x = in[0].data<float>();
  float* y = out[0].data<float>();
  const float s = node.attr<ScaleAttrs>().scale;
  map_rows(env, in[0].numel(), [&](int64_t i) { y[i] = x[i] * s; });
}

// Activations run vectorized (vector_math.h) over chunks of at least this many elements each.
constexpr int64_t kActivationGrain = 16384;

void activation(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
                const KernelEnv& env) {
  const float* x = in[0].data<float>();
  float* y = out[0].data<float>();
  const Activation a = node.attr<ActivationAttrs>().activation;
  env.pool.parallel_for(in[0].numel(), kActivationGrain,
                        [&](int64_t b, int64_t e) { apply_activation(a, x + b, y + b, e - b); });
}

namespace {

using GatedFn = void (*)(Activation, const float*, const float*, float*, int64_t);

// gate [n, f], up [n, f] -> act(gate) * up; or packed [n, 2f], each row gate | up
void gated_activation_with(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
                           const KernelEnv& env, GatedFn apply) {
  float* y = out[0].data<float>();
  const Activation a = node.attr<ActivationAttrs>().activation;
  if (in.size() == 1 || !in[1].defined()) {
    const float* x = in[0].data<float>();
    const int64_t f = out[0].dim(-1), rows = out[0].numel() / std::max<int64_t>(f, 1);
    const int64_t grain = std::max<int64_t>(1, kActivationGrain / std::max<int64_t>(f, 1));
    env.pool.parallel_for(rows, grain, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) apply(a, x + r * 2 * f, x + r * 2 * f + f, y + r * f, f);
    });
    return;
  }
  const float* g = in[0].data<float>();
  const float* u = in[1].data<float>();
  env.pool.parallel_for(in[0].numel(), kActivationGrain,
                        [&](int64_t b, int64_t e) { apply(a, g + b, u + b, y + b, e - b); });
}

}  // namespace

void gated_activation(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
                      const KernelEnv& env) {
  gated_activation_with(node, in, out, env, apply_gated_activation);
}

void gated_activation_avx512(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
                             const KernelEnv& env) {
  gated_activation_with(node, in, out, env, apply_gated_activation_avx512);
}

// x [n, d] -> softmax over d, accumulated in fp32
void softmax(const Node&, std::span<const Tensor> in, std::span<Tensor> out, const KernelEnv&) {
  const Tensor& x = in[0];
  const int64_t d = x.dim(-1), n = x.numel() / d;
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x.data<float>() + r * d;
    float* yr = out[0].data<float>() + r * d;
    float mx = -INFINITY;
    for (int64_t i = 0; i < d; ++i) mx = std::max(mx, xr[i]);
    float sum = 0.0f;
    for (int64_t i = 0; i < d; ++i) sum += (yr[i] = std::exp(xr[i] - mx));
    for (int64_t i = 0; i < d; ++i) yr[i] /= sum;
  }
}

void cast(const Node&, std::span<const Tensor> in, std::span<Tensor> out, const KernelEnv&) {
  const Tensor& x = in[0];
  Tensor& y = out[0];
  const size_t n = static_cast<size_t>(x.numel());
  if (x.dtype() == y.dtype()) {
    std::memcpy(y.raw(), x.raw(), x.nbytes());
    return;
  }
  std::vector<float> tmp(n);
  dtype_traits(x.dtype()).to_float(x.raw(), tmp.data(), n);
  dtype_traits(y.dtype()).from_float(tmp.data(), y.raw(), n);
}

namespace {

typedef int32_t I8x8 __attribute__((vector_size(32)));

// The first index of the largest value of row[0, n) that is not banned: what the scheduler's
// scalar argmax computes (a NaN is never the larger), eight lanes at a time. Each lane keeps
// the first index of its largest value; the lanes' tie goes to the lowest index, the first in
// the row. Rows with bans or NaNs take the scalar loop.
int64_t argmax_row(const float* row, int64_t n, std::span<const int64_t> banned) {
  auto scalar = [&] {
    int64_t best = -1;
    for (int64_t i = 0; i < n; ++i) {
      if (std::find(banned.begin(), banned.end(), i) != banned.end()) continue;
      if (best < 0 || row[i] > row[best]) best = i;
    }
    return best < 0 ? int64_t{0} : best;
  };
  if (!banned.empty() || n < 8) return scalar();
  V8 best = load8(row);
  I8x8 at = {0, 1, 2, 3, 4, 5, 6, 7}, best_at = at;
  I8x8 nan = best != best;
  int64_t i = 8;
  for (; i + 8 <= n; i += 8) {
    const V8 v = load8(row + i);
    at += 8;
    const I8x8 larger = v > best;
    best = larger ? v : best;
    best_at = larger ? at : best_at;
    nan |= v != v;
  }
  bool any_nan = false;
  for (int l = 0; l < 8; ++l) any_nan |= nan[l] != 0;
  if (any_nan) return scalar();
  int l_best = 0;
  for (int l = 1; l < 8; ++l)
    if (best[l] > best[l_best] || (best[l] == best[l_best] && best_at[l] < best_at[l_best]))
      l_best = l;
  int64_t arg = best_at[l_best];
  for (; i < n; ++i)
    if (row[i] > row[arg]) arg = i;
  return arg;
}

}  // namespace

void argmax_rows(const Tensor& logits, std::span<int64_t> out, std::span<const int64_t> banned,
                 std::span<const uint8_t> banned_rows, ThreadPool& pool) {
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  KILN_CHECK(static_cast<int64_t>(out.size()) == rows && logits.dtype() == DType::kF32,
             "argmax_rows: {} outputs for {} rows of {}", out.size(), rows,
             dtype_name(logits.dtype()));
  const float* x = logits.data<float>();
  pool.parallel_for(rows, 1, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const bool ban = !banned_rows.empty() && banned_rows[r] != 0;
      out[r] = argmax_row(x + r * vocab, vocab, ban ? banned : std::span<const int64_t>{});
    }
  });
}

}  // namespace kiln::cpu
