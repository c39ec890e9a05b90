// The Linear of int8-weight and int4-weight plans on CUDA: fp16/bf16 activations (f32 for the
// Linears an fp16 T5 plan keeps in f32: its FFN output projections), int8 weights [out, in] with
// f32 per-output-channel scales, y = epilogue((x · q^T) · scale + bias), or int4 weights with f16
// scales per output channel and group of 128 inputs (graph/linear.h). Every path below takes
// both, folded norms included.
// Steps of up to i8_gemv_rows rows (decode; KILN_CUDA_I8_GEMV_ROWS, default 8, at most
// kI8GemvMaxRows) run the int8 GEMV (gemv_i8.cu), batched decode steps of up to skinny_rows
// (KILN_CUDA_SKINNY_ROWS, fp16/bf16) the skinny tensor-core GEMM reading int8 weights
// (skinny_gemm.cu: widened exactly in registers, the scale applied at the store),
// which streams one byte a weight; more rows (prompts) widen the weights a slice of output
// channels at a time into the node's scratch memory (in the activations' type) and multiply them
// on cuBLASLt (fp32 accumulation), the output slice written in place (ldc = out) with the bias in
// cuBLASLt's epilogue and a fused residual as C. Bias, activation, a fused residual, gathered rows
// (copied into the scratch first), a widened f32 output (fuse_linear_cast) and a folded input
// norm (fuse_norm_linear: gamma as the norm scale) are the extras it runs; the one-row GEMV takes
// the norm itself, other steps standardize x into the scratch with the norm kernel first.
#include <algorithm>
#include <initializer_list>
#include <map>
#include <tuple>

#include "backend/cuda/cuda_kernels.h"
#include "graph/workspace.h"

namespace kiln::cuda {
namespace {

// Weights widened per cuBLASLt call (elements of the slice buffer in the scratch memory).
constexpr int64_t kSliceElements = int64_t{8} << 20;

int64_t aligned(int64_t bytes) { return (bytes + 255) / 256 * 256; }

class QuantLinearKernel final : public CudaKernel {
 public:
  using CudaKernel::CudaKernel;
  ~QuantLinearKernel() override {
    for (auto& [key, plan] : plans_) {
      cublasLtMatrixLayoutDestroy(plan.a);
      cublasLtMatrixLayoutDestroy(plan.b);
      cublasLtMatrixLayoutDestroy(plan.c);
    }
    if (desc_ != nullptr) cublasLtMatmulDescDestroy(desc_);
  }

  void prepare(const Graph& graph) override {
    CudaKernel::prepare(graph);
    const LinearDesc d = describe_linear(node_);
    const Value& w = graph.values[d.operand(LinearOperand::kWeight)];
    widen_ = d.epilogue.widen;
    const Value& y = graph.values[node_.outputs[0]];
    dtype_ = widen_ ? graph.values[d.operand(LinearOperand::kX)].dtype : y.dtype;
    KILN_CHECK((w.dtype == DType::kI8 || w.dtype == DType::kI4) && w.shape.size() == 2 &&
                   !w.shape[0].is_symbolic() && !w.shape[1].is_symbolic(),
               "node '{}': the cuda quantized linear needs an i8 or i4 [out, in] weight of fixed "
               "shape",
               node_.name);
    i4_ = w.dtype == DType::kI4;
    KILN_CHECK(dtype_ == DType::kF16 || dtype_ == DType::kBF16 || dtype_ == DType::kF32,
               "node '{}': the cuda quantized linear multiplies into float activations, not {}",
               node_.name, dtype_name(dtype_));
    KILN_CHECK(!widen_ || y.dtype == DType::kF32, "node '{}': a widened linear stores f32, not {}",
               node_.name, dtype_name(y.dtype));
    KILN_CHECK(d.has(LinearOperand::kWeightScales), "node '{}': an {} weight needs its scales",
               node_.name, dtype_name(w.dtype));
    KILN_CHECK(!d.has(LinearOperand::kInputScale),
               "node '{}': the cuda quantized linear takes no int8 input (W8A8 runs on the CPU)",
               node_.name);
    out_ = w.shape[0].value;
    in_ = w.shape[1].value;
    KILN_CHECK(in_ % (i4_ ? 16 : 8) == 0,
               "node '{}': the cuda {} linear needs `in` ({}) a multiple of {}", node_.name,
               i4_ ? "int4" : "int8", in_, i4_ ? 16 : 8);
    norm_ = d.epilogue.norm;
    norm_eps_ = static_cast<float>(d.epilogue.norm_eps);
    norm_scaled_ = norm_ && d.has(LinearOperand::kNormScale);
    if (norm_) {
      // The norm kernel's unit weight (gamma where the Linear has a norm scale, f32) and zero
      // bias, for the steps that standardize x before the product.
      const DType t = norm_scaled_ ? DType::kF32 : dtype_;
      unit_ = ctx_.weights().filled_vector(t, in_, 1.0f);
      zero_ = ctx_.weights().filled_vector(t, in_, 0.0f);
    }
    activation_ = d.epilogue.activation;
    gather_ = d.has(LinearOperand::kRows);
    has_bias_ = d.has(LinearOperand::kBias);
    bias_in_epilogue_ = has_bias_ && graph.values[d.operand(LinearOperand::kBias)].dtype == dtype_;
    // Slices of a multiple of 64 channels (128-byte aligned offsets into y, bias and residual).
    slice_rows_ = std::min(out_, std::max<int64_t>(kSliceElements / in_ / 64 * 64, 64));
    y_shape_ = graph.values[node_.outputs[0]].shape;
    // Warps sized to what the SMs hold at once: the int8 GEMV's registers allow fewer warps an
    // SM than the fp16 GEMV's, and a grid of more warps than fit runs in two waves.
    // (gemv_split counts a row's 16-byte chunks of fp16: in_ halves are in_ / 8 of them, as
    // many as the int8 GEMV's 8-byte loads; an int4 row has half as many loads.)
    for (int n = 1; n <= kGemvMaxRows; ++n)
      split_[n] = gemv_split(
          FloatType::kF16, i4_ ? in_ / 2 : in_, out_, ctx_.device().multiprocessors,
          std::min(ctx_.gemv_warps_per_sm(n), gemv_i8_warps_per_sm(float_type(dtype_), n, i4_)));
    desc_ = make_linear_matmul_desc(
        CUBLAS_COMPUTE_32F, bias_in_epilogue_ ? std::optional(cublas_type(dtype_)) : std::nullopt);
  }

  // Scratch: the gathered rows of x, a folded norm's standardized rows (steps the GEMV does not
  // normalize itself), then (steps past the GEMV) a widened Linear's output in its own type and
  // the slice of widened weights.
  struct ScratchOffsets {
    int64_t gathered = 0, normed = 0, widened = 0, slice = 0, end = 0;
  };
  ScratchOffsets scratch_offsets(int64_t rows) const {
    const auto elem = static_cast<int64_t>(dtype_bytes(dtype_, 1));
    const bool gemm = !gemv_runs(rows);
    ScratchOffsets s;
    s.normed = gather_ ? aligned(rows * in_ * elem) : 0;
    // A folded norm's standardized rows (the steps where the GEMV does not take the norm).
    s.widened = s.normed + (norm_ ? aligned(rows * in_ * elem) : 0);
    s.slice = s.widened + (gemm && widen_ ? aligned(rows * out_ * elem) : 0);
    s.end = s.slice + (gemm ? aligned(slice_rows_ * in_ * elem) : 0);
    return s;
  }
  int64_t workspace_bytes(const Bindings& bindings) const override {
    int64_t n = 1;
    for (int64_t d : resolve_shape(y_shape_, bindings)) n *= d;
    return scratch_offsets(n / out_).end;
  }

  void run(const KernelArgs& args) override {
    const Tensor& x = *linear_input(args.in, LinearOperand::kX);
    const Tensor& w = *linear_input(args.in, LinearOperand::kWeight);
    const Tensor* scales = linear_input(args.in, LinearOperand::kWeightScales);
    Tensor& y = args.out[0];
    KILN_CHECK(x.device() == Device::kCuda && w.device() == Device::kCuda,
               "node '{}': the cuda linear reads device memory", node_.name);
    KILN_CHECK(x.dtype() == dtype_ && x.numel() % in_ == 0,
               "node '{}': input {} {} does not fit a [n, {}] {} linear", node_.name,
               dtype_name(x.dtype()), shape_str(x.shape()), in_, dtype_name(dtype_));
    if (i4_)
      KILN_CHECK(scales != nullptr && scales->dtype() == DType::kF16 &&
                     scales->numel() == out_ * int4_groups(in_),
                 "node '{}': an i4 weight's group scales must be f16 [{}, {}]", node_.name, out_,
                 int4_groups(in_));
    else
      KILN_CHECK(scales != nullptr && scales->dtype() == DType::kF32 && scales->numel() == out_,
                 "node '{}': an i8 weight's scales must be f32 [{}]", node_.name, out_);
    const Tensor* rows = gather_ ? linear_input(args.in, LinearOperand::kRows) : nullptr;
    KILN_CHECK(rows == nullptr || (rows->rank() == 1 && rows->device() == Device::kCuda &&
                                   (rows->dtype() == DType::kI64 || rows->dtype() == DType::kI32)),
               "node '{}': the rows a linear gathers must be a 1-d i64/i32 device tensor",
               node_.name);
    const int64_t n = rows != nullptr ? rows->numel() : x.numel() / in_;
    if (n == 0) return;
    const Tensor* residual = linear_input(args.in, LinearOperand::kResidual);
    KILN_CHECK(
        residual == nullptr || (residual->dtype() == dtype_ && residual->numel() == n * out_ &&
                                !activation_ && !widen_ && rows == nullptr),
        "node '{}': a fused residual must be a {} [{}, {}] tensor, after no activation, "
        "of no gathered or widened linear",
        node_.name, dtype_name(dtype_), n, out_);
    const Tensor* bias = has_bias_ ? linear_input(args.in, LinearOperand::kBias) : nullptr;
    KILN_CHECK(!widen_ || y.dtype() == DType::kF32,
               "node '{}': a widened linear stores f32, not {}", node_.name, dtype_name(y.dtype()));
    const ScratchOffsets at = scratch_offsets(n);
    KILN_CHECK(at.end == 0 || args.scratch != nullptr, "node '{}': a linear without its scratch",
               node_.name);
    char* scratch = static_cast<char*>(args.scratch);
    const FloatType t = float_type(dtype_);
    const void* xp = x.raw();
    if (rows != nullptr) {
      launch_gather_rows(t, x.raw(), x.numel() / in_, in_, index_type(rows->dtype()), rows->raw(),
                         n, scratch + at.gathered, ctx_.checks().status(), node_index_,
                         ctx_.kernel_stream());
      xp = scratch + at.gathered;
    }
    const auto* q = static_cast<const int8_t*>(w.raw());  // i4: two weights a byte
    const auto* s = i4_ ? nullptr : static_cast<const float*>(scales->raw());
    const void* group_scales = i4_ ? scales->raw() : nullptr;
    NormOperands norm;
    if (norm_) {
      norm.row_sums = linear_input(args.in, LinearOperand::kNormRowSums);
      norm.scale = norm_scaled_ ? linear_input(args.in, LinearOperand::kNormScale) : nullptr;
      const bool layer = *norm_ == InputNorm::kLayerNorm;
      KILN_CHECK((norm.row_sums != nullptr) == layer &&
                     (norm.row_sums == nullptr ||
                      (norm.row_sums->dtype() == DType::kF32 && norm.row_sums->numel() == out_)),
                 "node '{}': a folded {} needs {}", node_.name, input_norm_name(*norm_),
                 layer ? "f32 row sums [out]" : "no row sums");
      KILN_CHECK(norm.scale == nullptr ||
                     (norm.scale->dtype() == DType::kF32 && norm.scale->numel() == in_),
                 "node '{}': a folded norm's scale must be f32 [{}]", node_.name, in_);
    }
    // The GEMV takes a folded norm at one row; other steps standardize x first.
    const bool gemv = gemv_runs(n) && gemv_i8_fits(xp, q, in_, i4_);
    if (norm_ && !(gemv && n == 1)) {
      xp = standardize(xp, n, norm, scratch + at.normed);
      norm = {};
    }
    if (gemv) {
      GemvI8Params p{};
      p.type = t;
      p.x = xp;
      p.w = q;
      p.scales = s;
      p.group_scales = group_scales;
      p.bias_type = float_type(bias ? bias->dtype() : dtype_);
      p.bias = bias ? bias->raw() : nullptr;
      p.residual = residual ? residual->raw() : nullptr;
      p.y = y.raw();
      p.y32 = widen_ ? static_cast<float*>(y.raw()) : nullptr;
      p.rows = n;
      p.in = in_;
      p.out = out_;
      p.split = split_[std::min<int64_t>(n, kGemvMaxRows)];
      p.has_act = activation_.has_value();
      p.act = act_fn(activation_.value_or(Activation::kRelu));
      p.norm = norm_.has_value() && n == 1;
      p.norm_row_sums = norm.row_sums ? static_cast<const float*>(norm.row_sums->raw()) : nullptr;
      p.norm_scale = norm.scale ? static_cast<const float*>(norm.scale->raw()) : nullptr;
      p.norm_eps = norm_eps_;
      KILN_CHECK(launch_gemv_i8(p, ctx_.kernel_stream()),
                 "node '{}': the int8 GEMV cannot take this folded norm (its scale at {})",
                 node_.name, static_cast<const void*>(p.norm_scale));
      return;
    }
    // (A bias of another type than the activations' goes to the widened path, as the float
    // Linear's skinny GEMM leaves it to cuBLASLt.)
    if (n <= ctx_.options().skinny_rows && dtype_ != DType::kF32 &&
        (bias == nullptr || bias_in_epilogue_) && skinny_fits(t, xp, q, in_, n, !i4_, i4_)) {
      SkinnyParams p{};
      p.type = t;
      p.x = xp;
      p.w = q;
      p.scales = s;
      p.group_scales = group_scales;
      p.bias = bias ? bias->raw() : nullptr;
      p.residual = residual ? residual->raw() : nullptr;
      p.y = y.raw();
      p.y32 = widen_ ? static_cast<float*>(y.raw()) : nullptr;
      p.rows = n;
      p.in = in_;
      p.out = out_;
      p.has_act = activation_.has_value();
      p.act = act_fn(activation_.value_or(Activation::kRelu));
      p.sms = ctx_.device().multiprocessors;
      launch_skinny(p, ctx_.kernel_stream());
      return;
    }
    KILN_CHECK(!gemv_runs(n),
               "node '{}': the {} GEMV needs x 16-byte and the weight 8-byte aligned (x at {}, "
               "weight at {})",
               node_.name, i4_ ? "int4" : "int8", xp, static_cast<const void*>(q));
    void* yp = widen_ ? scratch + at.widened : y.raw();
    void* slice = scratch + at.slice;
    const auto elem = static_cast<int64_t>(dtype_bytes(dtype_, 1));
    for (int64_t o0 = 0; o0 < out_; o0 += slice_rows_) {
      const int64_t rows_here = std::min(slice_rows_, out_ - o0);
      if (i4_)
        launch_dequantize_i4(t, q + o0 * in_ / 2,
                             static_cast<const char*>(group_scales) + o0 * int4_groups(in_) * 2,
                             slice, rows_here, in_, ctx_.kernel_stream());
      else
        launch_dequantize_i8(t, q + o0 * in_, s + o0, slice, rows_here, in_, ctx_.kernel_stream());
      if (bias_in_epilogue_) {
        const void* b = static_cast<const char*>(bias->raw()) + o0 * elem;
        KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                         &b, sizeof(b)));
      }
      const float alpha = 1.0f, beta = residual ? 1.0f : 0.0f;
      void* d = static_cast<char*>(yp) + o0 * elem;
      const void* c = residual ? static_cast<const char*>(residual->raw()) + o0 * elem : d;
      const Plan& plan = plan_for(n, rows_here, pointer_alignment({slice, xp, d, c}));
      ctx_.launch().note_library_launch();
      const cublasStatus_t st =
          cublasLtMatmul(ctx_.blas().handle(), desc_, &alpha, slice, plan.a, xp, plan.b, &beta, c,
                         plan.c, d, plan.c, &plan.algo, ctx_.blas().workspace(),
                         ctx_.blas().workspace_bytes(), ctx_.stream());
      KILN_CHECK(st == CUBLAS_STATUS_SUCCESS,
                 "node '{}': cuBLASLt refused the [{}, {}] x [{}, {}]^T {} matmul of a widened "
                 "quantized slice: {}",
                 node_.name, n, in_, rows_here, in_, dtype_name(dtype_), cublas_status_name(st));
    }
    const bool bias_after = bias != nullptr && !bias_in_epilogue_;
    if (bias_after || activation_)
      launch_bias_activation(t, yp, bias_after ? float_type(bias->dtype()) : t,
                             bias_after ? bias->raw() : nullptr, n, out_, activation_.has_value(),
                             act_fn(activation_.value_or(Activation::kRelu)), ctx_.kernel_stream());
    if (widen_) launch_cast(t, FloatType::kF32, yp, y.raw(), n * out_, ctx_.kernel_stream());
  }

 private:
  // A folded norm's operands as the kernel reads them (null: absent).
  struct NormOperands {
    const Tensor* row_sums = nullptr;  // LayerNorm: f32 [out], of q · gamma
    const Tensor* scale = nullptr;     // gamma, f32 [in]
  };

  // Rows x [n, in] standardized into `dst` by the norm kernel with gamma (or a unit weight) and
  // zero bias: (x - mean) / std * gamma, or x / rms * gamma; the folded bias and row scales do the
  // rest. Returns dst.
  const void* standardize(const void* x, int64_t n, const NormOperands& norm, void* dst) {
    const FloatType t = float_type(dtype_);
    const FloatType wt = norm_scaled_ ? FloatType::kF32 : t;
    const void* g = norm.scale != nullptr ? norm.scale->raw() : unit_.raw();
    if (norm.row_sums != nullptr)
      launch_layer_norm(t, wt, x, g, zero_.raw(), dst, n, in_, norm_eps_, ctx_.kernel_stream());
    else
      launch_rms_norm(t, wt, x, g, dst, n, in_, norm_eps_, ctx_.kernel_stream());
    return dst;
  }

  struct Plan {
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };

  // Whether n rows run on the int8 GEMV (KILN_CUDA_GEMV=0 turns it off as it does the float one).
  bool gemv_runs(int64_t n) const {
    return ctx_.options().gemv && n <= ctx_.options().i8_gemv_rows;
  }

  // Layouts and the heuristic's first algorithm for n rows against a slice of `features`
  // output channels (one per row count, slice size and operand alignment: the last slice may be
  // shorter; above gemm_row_bucket rows, the bucket's algorithm where it applies).
  const Plan& plan_for(int64_t n, int64_t features, uint32_t align) {
    const auto key = std::make_tuple(n, features, align);
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
    Plan p;
    const cudaDataType_t t = cublas_type(dtype_);
    const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, t, u(in_), u(features), in_));
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, t, u(in_), u(n), in_));
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, t, u(features), u(n), out_));
    // Above gemm_row_bucket rows: the algorithm chosen for the bucket's top row count, if
    // cuBLASLt accepts it for n rows (one heuristic query per bucket, as the float Linear does:
    // served prompt steps have a new row count almost every time).
    const int64_t bucket = ctx_.options().gemm_row_bucket;
    if (bucket > 0 && n > bucket && n % bucket != 0) {
      const Plan& shared = plan_for((n + bucket - 1) / bucket * bucket, features, align);
      cublasLtMatmulHeuristicResult_t check{};
      if (cublasLtMatmulAlgoCheck(ctx_.blas().handle(), desc_, p.a, p.b, p.c, p.c, &shared.algo,
                                  &check) == CUBLAS_STATUS_SUCCESS &&
          check.workspaceSize <= ctx_.blas().workspace_bytes()) {
        p.algo = shared.algo;
        return plans_.emplace(key, p).first->second;
      }
    }
    // Every operand (the slice in the scratch, x, y, the residual) as aligned as `align` says.
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st = heuristic_algorithms(
        ctx_.blas().handle(), desc_, p.a, p.b, p.c, ctx_.blas().workspace_bytes(),
        {align, align, align, align}, 1, &result, &found);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
      cublasLtMatrixLayoutDestroy(p.a);
      cublasLtMatrixLayoutDestroy(p.b);
      cublasLtMatrixLayoutDestroy(p.c);
      KILN_FAIL(
          "node '{}': cuBLASLt has no algorithm for a {} linear of [{}, {}] x [{}, {}]^T ({})",
          node_.name, dtype_name(dtype_), n, in_, features, in_, cublas_status_name(st));
    }
    p.algo = result.algo;
    return plans_.emplace(key, p).first->second;
  }

  int64_t in_ = 0, out_ = 0, slice_rows_ = 1;
  DType dtype_ = DType::kF16;
  std::optional<InputNorm> norm_;
  float norm_eps_ = 0.0f;
  bool norm_scaled_ = false;  // the folded norm's gamma is operand kNormScale
  Tensor unit_, zero_;        // the norm kernel's weight and bias where x is standardized first
  std::optional<Activation> activation_;
  bool widen_ = false, gather_ = false, has_bias_ = false, bias_in_epilogue_ = false;
  bool i4_ = false;  // int4 weights with f16 group scales (int4-weight plans)
  SymShape y_shape_;
  int split_[kGemvMaxRows + 1] = {};
  cublasLtMatmulDesc_t desc_ = nullptr;
  std::map<std::tuple<int64_t, int64_t, uint32_t>, Plan> plans_;
};

}  // namespace

std::unique_ptr<Kernel> make_quant_linear_kernel(const Node& node, CudaContext& ctx) {
  return std::make_unique<QuantLinearKernel>(node, ctx);
}

}  // namespace kiln::cuda
