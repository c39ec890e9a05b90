// Elementwise ops, activations, softmax and casts.
#include <cmath>

#include "backend/cpu/kernels.h"
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

// gate [n, f], up [n, f] -> act(gate) * up
void gated_activation(const Node& node, std::span<const Tensor> in, std::span<Tensor> out,
                      const KernelEnv& env) {
  const float* g = in[0].data<float>();
  const float* u = in[1].data<float>();
  float* y = out[0].data<float>();
  const Activation a = node.attr<ActivationAttrs>().activation;
  env.pool.parallel_for(in[0].numel(), kActivationGrain, [&](int64_t b, int64_t e) {
    apply_gated_activation(a, g + b, u + b, y + b, e - b);
  });
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

}  // namespace kiln::cpu
