// The CUDA kernel table, and the node kernels that are one launch each (everything but Linear
// and Attention): they check what the host knows and enqueue the launchers of kernels.cuh.
#include "backend/cuda/cuda_kernels.h"

namespace kiln::cuda {
namespace {

struct Launch {
  const Node& node;
  const KernelArgs& args;
  CudaContext& ctx;
  int index;
  KernelStream stream() const { return ctx.kernel_stream(); }
};
using LaunchFn = void (*)(const Launch&);

class FnKernel final : public CudaKernel {
 public:
  FnKernel(const Node& node, CudaContext& ctx, LaunchFn fn) : CudaKernel(node, ctx), fn_(fn) {}
  void run(const KernelArgs& args) override {
    for (const Tensor& t : args.in)
      KILN_CHECK(!t.defined() || t.device() == Device::kCuda,
                 "node '{}': an input is in {} memory, the cuda kernels read device memory",
                 node_.name, device_name(t.device()));
    fn_(Launch{node_, args, ctx_, node_index_});
  }

 private:
  LaunchFn fn_;
};

// table [vocab, d], ids [n] -> [n, d]
void embedding(const Launch& l) {
  const Tensor& table = l.args.in[0];
  const Tensor& ids = l.args.in[1];
  launch_embedding(float_type(table.dtype()), table.raw(), table.dim(0), table.dim(1),
                   index_type(ids.dtype()), ids.raw(), ids.dim(0), l.args.out[0].raw(),
                   l.ctx.checks().status(), l.index, l.stream());
}

// table i8 [vocab, d], ids [n], scales f32 [vocab] -> f32 [n, d] (int8-weight plans)
void embedding_i8(const Launch& l) {
  KILN_CHECK(l.args.in.size() > 2 && l.args.in[2].defined(),
             "node '{}': an i8 table needs its per-row scales", l.node.name);
  const Tensor& table = l.args.in[0];
  const Tensor& ids = l.args.in[1];
  const Tensor& scales = l.args.in[2];
  KILN_CHECK(scales.dtype() == DType::kF32 && scales.numel() == table.dim(0),
             "node '{}': an i8 table's scales must be f32 [{}]", l.node.name, table.dim(0));
  launch_embedding_i8(
      static_cast<const int8_t*>(table.raw()), static_cast<const float*>(scales.raw()),
      table.dim(0), table.dim(1), index_type(ids.dtype()), ids.raw(), ids.dim(0),
      static_cast<float*>(l.args.out[0].raw()), l.ctx.checks().status(), l.index, l.stream());
}

// x [n, d], rows [r] -> [r, d]
void gather_rows(const Launch& l) {
  const Tensor& x = l.args.in[0];
  const Tensor& rows = l.args.in[1];
  launch_gather_rows(float_type(x.dtype()), x.raw(), x.dim(0), x.dim(1), index_type(rows.dtype()),
                     rows.raw(), rows.dim(0), l.args.out[0].raw(), l.ctx.checks().status(), l.index,
                     l.stream());
}

// a, b [n, d] -> [n, d]
void add(const Launch& l) {
  Tensor& y = l.args.out[0];
  launch_binary(BinaryOp::kAdd, float_type(y.dtype()), l.args.in[0].raw(), l.args.in[1].raw(),
                y.raw(), y.numel(), l.stream());
}

void mul(const Launch& l) {
  Tensor& y = l.args.out[0];
  launch_binary(BinaryOp::kMul, float_type(y.dtype()), l.args.in[0].raw(), l.args.in[1].raw(),
                y.raw(), y.numel(), l.stream());
}

// x -> x * scale
void scale(const Launch& l) {
  Tensor& y = l.args.out[0];
  launch_scale(float_type(y.dtype()), l.args.in[0].raw(), l.node.attr<ScaleAttrs>().scale, y.raw(),
               y.numel(), l.stream());
}

// x -> x as CastAttrs::to
void cast(const Launch& l) {
  Tensor& y = l.args.out[0];
  launch_cast(float_type(l.args.in[0].dtype()), float_type(y.dtype()), l.args.in[0].raw(), y.raw(),
              y.numel(), l.stream());
}

// x -> act(x)
void activation(const Launch& l) {
  Tensor& y = l.args.out[0];
  launch_activation(act_fn(l.node.attr<ActivationAttrs>().activation), float_type(y.dtype()),
                    l.args.in[0].raw(), y.raw(), y.numel(), l.stream());
}

// gate, up [n, f] -> act(gate) * up; or packed [n, 2f], each row gate | up
void gated_activation(const Launch& l) {
  Tensor& y = l.args.out[0];
  const ActFn act = act_fn(l.node.attr<ActivationAttrs>().activation);
  const FloatType t = float_type(y.dtype());
  if (l.args.in.size() == 1 || !l.args.in[1].defined()) {
    const int64_t f = y.dim(-1), rows = f > 0 ? y.numel() / f : 0;
    const char* x = static_cast<const char*>(l.args.in[0].raw());
    launch_gated(act, t, x, x + dtype_bytes(y.dtype(), static_cast<size_t>(f)), y.raw(), rows, f,
                 2 * f, l.stream());
    return;
  }
  launch_gated(act, t, l.args.in[0].raw(), l.args.in[1].raw(), y.raw(), 1, y.numel(), y.numel(),
               l.stream());
}

// x [n, d] -> softmax over d
void softmax(const Launch& l) {
  Tensor& y = l.args.out[0];
  const int64_t d = y.dim(-1);
  launch_softmax(float_type(y.dtype()), l.args.in[0].raw(), y.raw(), d > 0 ? y.numel() / d : 0, d,
                 l.stream());
}

// x [n, d], w [d] -> [n, d]
void rms_norm(const Launch& l) {
  Tensor& y = l.args.out[0];
  const int64_t d = y.dim(-1);
  launch_rms_norm(float_type(y.dtype()), float_type(l.args.in[1].dtype()), l.args.in[0].raw(),
                  l.args.in[1].raw(), y.raw(), d > 0 ? y.numel() / d : 0, d,
                  static_cast<float>(l.node.attr<NormAttrs>().eps), l.stream());
}

// x [n, d], w [d], b [d] -> [n, d]
// With rows [r] (a fused embedding): x is a table, y [r, d] its normalized rows x[rows].
void layer_norm(const Launch& l) {
  Tensor& y = l.args.out[0];
  const int64_t d = y.dim(-1);
  KILN_CHECK(l.args.in[1].dtype() == l.args.in[2].dtype(),
             "node '{}': the cuda layer norm takes weight and bias of one dtype", l.node.name);
  RowIndex gather;
  if (l.args.in.size() > 3 && l.args.in[3].defined()) {
    const Tensor& rows = l.args.in[3];
    gather = {rows.raw(), index_type(rows.dtype()), l.args.in[0].dim(0), l.ctx.checks().status(),
              l.index};
  }
  launch_layer_norm(float_type(y.dtype()), float_type(l.args.in[1].dtype()), l.args.in[0].raw(),
                    l.args.in[1].raw(), l.args.in[2].raw(), y.raw(), d > 0 ? y.numel() / d : 0, d,
                    static_cast<float>(l.node.attr<NormAttrs>().eps), l.stream(), gather);
}

// a, b [n, d], w [d] -> (a + b, rmsnorm(a + b) * w)
void add_rms_norm(const Launch& l) {
  Tensor& sum = l.args.out[0];
  const int64_t d = sum.dim(-1);
  launch_add_rms_norm(float_type(sum.dtype()), float_type(l.args.in[2].dtype()), l.args.in[0].raw(),
                      l.args.in[1].raw(), l.args.in[2].raw(), sum.raw(), l.args.out[1].raw(),
                      d > 0 ? sum.numel() / d : 0, d,
                      static_cast<float>(l.node.attr<NormAttrs>().eps), l.stream());
}

}  // namespace

void register_kernels(KernelRegistry& r, CudaContext& ctx) {
  constexpr DType kFloats[] = {DType::kF32, DType::kF16, DType::kBF16};
  auto add_fn = [&](OpKind op, DType act, DType weight, const char* name, LaunchFn fn,
                    ExtraSet extras = {}) {
    r.add(
        KernelKey{op, act, weight, Device::kCuda, Isa::kSm90}, name,
        [&ctx, fn](const Node& node) { return std::make_unique<FnKernel>(node, ctx, fn); }, extras);
  };
  // Every fused extra of a float-weight Linear (cuda_linear.cc).
  const ExtraSet linear_extras{Extra::kBias,          Extra::kActivation,   Extra::kResidual,
                               Extra::kLayerNormFold, Extra::kRmsNormFold,  Extra::kNormScale,
                               Extra::kGatheredRows,  Extra::kWidenedOutput};
  // int8-weight plans: int8 weights with per-channel scales into fp16/bf16 activations (and
  // their widened f32 logits, and fp16 T5's f32 FFN output projections), cuda_linear_i8.cc,
  // folded norms included; no int8 inputs (W8A8 runs on the CPU only).
  const ExtraSet i8_linear_extras{
      Extra::kBias,          Extra::kWeightScales, Extra::kActivation,
      Extra::kResidual,      Extra::kGatheredRows, Extra::kWidenedOutput,
      Extra::kLayerNormFold, Extra::kRmsNormFold,  Extra::kNormScale};
  // W8A8 and fp8 Linears (an input scale): no folded norm (x is quantized after it).
  const ExtraSet quantized_input_extras{
      Extra::kBias,         Extra::kWeightScales,  Extra::kActivation,    Extra::kResidual,
      Extra::kGatheredRows, Extra::kWidenedOutput, Extra::kQuantizedInput};
  for (DType t : {DType::kF16, DType::kBF16, DType::kF32}) {
    r.add(
        KernelKey{OpKind::kLinear, t, DType::kI8, Device::kCuda, Isa::kSm90},
        t == DType::kF32 ? "cuda int8-weight linear (f32 activations or output; int8 gemv / "
                           "skinny gemm / widened cublaslt)"
                         : "cuda int8-weight linear (int8 gemv / skinny gemm / widened cublaslt)",
        [&ctx](const Node& node) { return make_quant_linear_kernel(node, ctx); }, i8_linear_extras);
    // int8 (W8A8) plans: the input quantized with its calibrated scale, int8 products.
    r.add(
        KernelKey{OpKind::kLinear, t, DType::kI8, Device::kCuda, Isa::kSm90},
        "cuda W8A8 linear (int8 dp4a gemv / cublaslt int8 gemm)",
        [&ctx](const Node& node) { return make_w8a8_linear_kernel(node, ctx); },
        quantized_input_extras);
    // int4-weight plans: int4 weights with f16 group scales, the same kernel.
    r.add(
        KernelKey{OpKind::kLinear, t, DType::kI4, Device::kCuda, Isa::kSm90},
        t == DType::kF32 ? "cuda int4-weight linear (f32 activations or output; int4 gemv / "
                           "skinny gemm / widened cublaslt)"
                         : "cuda int4-weight linear (int4 gemv / skinny gemm / widened cublaslt)",
        [&ctx](const Node& node) { return make_quant_linear_kernel(node, ctx); }, i8_linear_extras);
  }
  // fp8 plans: E4M3 weights and inputs, the W8A8 kernel's fp8 instances.
  for (DType t : {DType::kF16, DType::kBF16, DType::kF32})
    r.add(
        KernelKey{OpKind::kLinear, t, DType::kF8E4M3, Device::kCuda, Isa::kSm90},
        "cuda fp8 linear (e4m3 gemv / cublaslt fp8 gemm)",
        [&ctx](const Node& node) { return make_w8a8_linear_kernel(node, ctx); },
        quantized_input_extras);
  add_fn(OpKind::kEmbedding, DType::kF32, DType::kI8, "cuda int8 embedding gather", embedding_i8);
  for (DType t : kFloats) {
    add_fn(OpKind::kEmbedding, t, t, "cuda embedding gather", embedding);
    add_fn(OpKind::kGatherRows, t, t, "cuda gather rows", gather_rows);
    add_fn(OpKind::kAdd, t, t, "cuda add", add);
    add_fn(OpKind::kMul, t, t, "cuda mul", mul);
    add_fn(OpKind::kScale, t, t, "cuda scale", scale);
    add_fn(OpKind::kActivation, t, t, "cuda activation", activation);
    add_fn(OpKind::kGatedActivation, t, t, "cuda gated activation", gated_activation);
    add_fn(OpKind::kSoftmax, t, t, "cuda softmax (fp32)", softmax);
    r.add(
        KernelKey{OpKind::kLinear, t, t, Device::kCuda, Isa::kSm90},
        t == DType::kF32 ? "cuda linear (fp32; gemv / cublaslt)"
                         : "cuda linear (fp32 accumulation; gemv / cublaslt)",
        [&ctx](const Node& node) { return make_linear_kernel(node, ctx); }, linear_extras);
    // fp16 / bf16 Linears widened to f32 outputs (fuse_linear_cast: the logits).
    if (t != DType::kF32)
      r.add(
          KernelKey{OpKind::kLinear, DType::kF32, t, Device::kCuda, Isa::kSm90},
          "cuda linear (fp32 accumulation, f32 output; gemv / cublaslt)",
          [&ctx](const Node& node) { return make_linear_kernel(node, ctx); }, linear_extras);
    // Norm weights of any float type (fp16 T5 plans norm the f32 residual stream with fp16
    // weights); attention's position-bias table likewise.
    for (DType w : kFloats) {
      add_fn(OpKind::kRmsNorm, t, w, "cuda rms norm", rms_norm);
      add_fn(OpKind::kLayerNorm, t, w, "cuda layer norm", layer_norm, {Extra::kGatheredRows});
      add_fn(OpKind::kAddRmsNorm, t, w, "cuda add + rms norm", add_rms_norm);
      r.add(KernelKey{OpKind::kAttention, t, w, Device::kCuda, Isa::kSm90},
            "cuda paged attention (online softmax)",
            [&ctx](const Node& node) { return make_attention_kernel(node, ctx); });
    }
    // Casts between any two float types, of activations or of weights.
    for (DType from : kFloats) add_fn(OpKind::kCast, t, from, "cuda cast", cast);
  }
}

}  // namespace kiln::cuda
