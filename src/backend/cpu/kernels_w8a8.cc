// The W8A8 Linear (graph/linear.h: an input scale) of the AVX-512 family where its int8 dot
// products do not run (a CPU without AVX512-VNNI and VBMI, or KILN_CPU_INT8_DOT=off): the input
// quantized to its int8 values by the definition (quantize_input), held as f32, then the packed
// i8-weight Linear's f32 FMAs over them (kernels_packed.cc) with s · scale[o] as the per-channel
// scale. Each product q · w is an integer below 2^14, exact in f32; their sum rounds as any f32
// sum does once it passes 2^24 (relative 1e-7): the same numbers as the dot products to f32
// accuracy, not bit for bit. A row's quantization depends on that row and the static scale alone,
// and the packed kernel sums each row in a fixed order, so a row's result does not depend on its
// batch.
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <vector>

#include "backend/cpu/kernels.h"
#include "backend/cpu/packed_linear.h"

// GCC 12 reports the _mm512_undefined_* placeholders inside its own AVX-512 intrinsics as
// "(maybe) uninitialized" once they inline here (a false positive).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

namespace kiln::cpu {
namespace {

// x [n, k] -> q [n, k]: each element's int8 value (quantize_input) as an f32, sixteen at a time.
KILN_TARGET_AVX512 void quantize_to_float_levels(const float* x, int64_t count, float inv,
                                                 float* q) {
  const __m512 vinv = _mm512_set1_ps(inv);
  const __m512 lo = _mm512_set1_ps(-127.f), hi = _mm512_set1_ps(127.f);
  for (int64_t i = 0; i < count; i += 16) {
    const int64_t left = std::min<int64_t>(count - i, 16);
    const __mmask16 m = _cvtu32_mask16(left >= 16 ? 0xffffu : (1u << left) - 1);
    __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vinv);
    v = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(v, v, _CMP_ORD_Q), v);  // NaN -> 0
    v = _mm512_max_ps(_mm512_min_ps(v, hi), lo);
    _mm512_mask_storeu_ps(q + i, m,
                          _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
}

class W8a8PackedFmaLinear final : public Kernel {
 public:
  explicit W8a8PackedFmaLinear(const Node& node)
      : node_(node), inner_(packed_linear_factory(DType::kI8)(node)) {}

  void prepare(const Graph& graph) override {
    inner_->prepare(graph);
    x_shape_ = graph.values[node_.inputs[0]].shape;
  }

  // The quantized rows (n · k floats, 64-byte rounded), then the packed kernel's workspace.
  int64_t workspace_bytes(const Bindings& bindings) const override {
    return levels_bytes(bindings) + inner_->workspace_bytes(bindings);
  }

  void run(const KernelArgs& args) override {
    KILN_CHECK(args.pool != nullptr, "cpu kernel '{}' without a thread pool", node_.name);
    const Tensor& x = *linear_input(args.in, LinearOperand::kX);
    const Tensor* scales = linear_input(args.in, LinearOperand::kWeightScales);
    const Tensor* input_scale = linear_input(args.in, LinearOperand::kInputScale);
    KILN_CHECK(x.dtype() == DType::kF32 && scales != nullptr && input_scale != nullptr,
               "node '{}': a W8A8 Linear takes an f32 input, weight scales and an input scale",
               node_.name);
    const float s = input_scale->data<float>()[0];
    KILN_CHECK(std::isfinite(s) && s >= 0.0f,
               "node '{}': the input scale is {}, not a finite non-negative number", node_.name, s);
    const int64_t count = x.numel(), m = scales->numel();
    // The per-channel scales with the input's folded in: s · scale[o].
    combined_.resize(static_cast<size_t>(m));
    const float* ws = scales->data<float>();
    for (int64_t o = 0; o < m; ++o) combined_[o] = s * ws[o];
    std::vector<float> own;  // callers without a workspace (micro-benchmarks)
    float* levels;
    if (args.scratch != nullptr) {
      levels = static_cast<float*>(args.scratch);
    } else {
      own.resize(static_cast<size_t>(count));
      levels = own.data();
    }
    const float inv = input_inv_scale(s);
    const float* xp = x.data<float>();
    constexpr int64_t kChunk = 16384;
    args.pool->parallel_for((count + kChunk - 1) / kChunk, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c)
        quantize_to_float_levels(xp + c * kChunk, std::min(kChunk, count - c * kChunk), inv,
                                 levels + c * kChunk);
    });
    std::vector<Tensor> in(args.in.begin(), args.in.end());
    in[slot(LinearOperand::kX)] = Tensor::view(DType::kF32, x.shape(), levels, nullptr);
    in[slot(LinearOperand::kWeightScales)] =
        Tensor::view(DType::kF32, scales->shape(), combined_.data(), nullptr);
    KernelArgs inner = args;
    inner.in = in;
    inner.scratch = args.scratch != nullptr
                        ? static_cast<char*>(args.scratch) + levels_bytes_for(count)
                        : nullptr;
    inner_->run(inner);
  }

 private:
  static int64_t levels_bytes_for(int64_t count) {
    return (count * static_cast<int64_t>(sizeof(float)) + 63) / 64 * 64;
  }
  int64_t levels_bytes(const Bindings& bindings) const {
    int64_t count = 1;
    for (int64_t d : resolve_shape(x_shape_, bindings)) count *= d;
    return levels_bytes_for(count);
  }

  const Node& node_;
  std::unique_ptr<Kernel> inner_;
  SymShape x_shape_;
  std::vector<float> combined_;  // s · scale[o], this run's
};

}  // namespace

KernelFactory packed_w8a8_fma_linear_factory() {
  return [](const Node& n) { return std::make_unique<W8a8PackedFmaLinear>(n); };
}

}  // namespace kiln::cpu
