// The Linear of W8A8 (int8) and fp8 plans on CUDA: x (fp16/bf16, or f32) read as int8 (E4M3)
// with its static calibrated scale s (graph/linear.h: quantize_input, quantize_input_fp8), int8
// (E4M3) weights [out, in] with f32 per-output-channel scales, the products summed in int32
// (f32), y = epilogue(Σ · s · scale[o] + bias): bias, activation, a fused residual, gathered rows
// (copied into the scratch first) and a widened f32 output. Steps of up to
// KILN_CUDA_W8A8_GEMV_ROWS rows (decode; default 8, at most kW8a8GemvMaxRows) run the GEMV
// (gemv_w8a8.cu: x quantized in registers; dp4a, or E4M3 widened exactly); more rows quantize x
// into the scratch, multiply on cuBLASLt's int8 (FP8) tensor-core GEMM (int32 / f32 results, in row
// chunks that bound the scratch), and the epilogue kernel stores y. If cuBLASLt offers no algorithm
// for a shape, the GEMV runs those rows too (slower, the same numbers up to the f32 sums' order).
#include <algorithm>
#include <map>
#include <tuple>

#include "backend/cuda/cuda_kernels.h"
#include "graph/workspace.h"

namespace kiln::cuda {
namespace {

// The int32 results of one cuBLASLt call (elements): rows are multiplied in chunks of at most
// this many outputs.
constexpr int64_t kAccElements = int64_t{8} << 20;

int64_t aligned(int64_t bytes) { return (bytes + 255) / 256 * 256; }

class W8a8LinearKernel final : public CudaKernel {
 public:
  using CudaKernel::CudaKernel;
  ~W8a8LinearKernel() override {
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
    KILN_CHECK((w.dtype == DType::kI8 || w.dtype == DType::kF8E4M3) && w.shape.size() == 2 &&
                   !w.shape[0].is_symbolic() && !w.shape[1].is_symbolic(),
               "node '{}': the cuda W8A8 / fp8 linear needs an i8 or f8_e4m3 [out, in] weight of "
               "fixed shape",
               node_.name);
    fp8_ = w.dtype == DType::kF8E4M3;
    KILN_CHECK(!fp8_ || ctx_.device().sm >= 89,
               "node '{}': fp8 plans need FP8 tensor cores (sm_89 or newer: Ada, Hopper); {} is "
               "sm_{}: build int8 (W8A8) or int8-weight for it",
               node_.name, ctx_.device().name, ctx_.device().sm);
    KILN_CHECK(dtype_ == DType::kF16 || dtype_ == DType::kBF16 || dtype_ == DType::kF32,
               "node '{}': the cuda W8A8 linear reads float activations, not {}", node_.name,
               dtype_name(dtype_));
    KILN_CHECK(d.has(LinearOperand::kWeightScales) && d.has(LinearOperand::kInputScale),
               "node '{}': the cuda W8A8 linear needs the weight's scales and the input scale",
               node_.name);
    KILN_CHECK(!d.epilogue.norm, "node '{}': a W8A8 linear folds no norm", node_.name);
    out_ = w.shape[0].value;
    in_ = w.shape[1].value;
    KILN_CHECK(in_ % (fp8_ ? 16 : 8) == 0,
               "node '{}': the cuda {} linear needs `in` ({}) a multiple of {}", node_.name,
               fp8_ ? "fp8" : "W8A8", in_, fp8_ ? 16 : 8);
    activation_ = d.epilogue.activation;
    gather_ = d.has(LinearOperand::kRows);
    has_bias_ = d.has(LinearOperand::kBias);
    y_shape_ = graph.values[node_.outputs[0]].shape;
    chunk_rows_ = std::max<int64_t>(kAccElements / out_, 256);
    // The input scale is a constant of the plan: read once, here.
    const Value& s = graph.values[d.operand(LinearOperand::kInputScale)];
    KILN_CHECK(s.data.defined() && s.data.dtype() == DType::kF32 && s.data.numel() == 1,
               "node '{}': the input scale must be a constant f32 [1]", node_.name);
    x_scale_ = s.data.to_f32().data<float>()[0];
    KILN_CHECK(std::isfinite(x_scale_) && x_scale_ >= 0.0f,
               "node '{}': the input scale is {}, not a finite non-negative number", node_.name,
               x_scale_);
    inv_scale_ = input_inv_scale(x_scale_);
    // Warps a feature group, as the int8-weight GEMV sizes them (an 8-byte load of 8 weights
    // is one of gemv_split's fp16 chunks): one row, and slices of 8 rows.
    for (const int64_t n : {int64_t{1}, int64_t{8}})
      split_[n == 1 ? 0 : 1] = gemv_split(
          FloatType::kF16, in_, out_, ctx_.device().multiprocessors,
          std::min(ctx_.gemv_warps_per_sm(n), gemv_w8a8_warps_per_sm(float_type(dtype_), n, fp8_)));
    // int8: int32 sums and scalars; FP8: f32 (the GEMM's own scale factors left at 1).
    desc_ = make_linear_matmul_desc(fp8_ ? CUBLAS_COMPUTE_32F : CUBLAS_COMPUTE_32I, std::nullopt,
                                    fp8_ ? CUDA_R_32F : CUDA_R_32I);
  }

  // Scratch: the gathered rows of x, then (for the GEMM, which any step may take: KILN_CUDA_GEMV=0,
  // a misaligned x) x quantized and a chunk's int32 (f32) results.
  struct ScratchOffsets {
    int64_t gathered = 0, quantized = 0, acc = 0, end = 0;
  };
  ScratchOffsets scratch_offsets(int64_t rows) const {
    const auto elem = static_cast<int64_t>(dtype_bytes(dtype_, 1));
    ScratchOffsets s;
    s.quantized = gather_ ? aligned(rows * in_ * elem) : 0;
    s.acc = s.quantized + aligned(rows * in_);
    s.end = s.acc + aligned(std::min(rows, chunk_rows_) * out_ * 4);
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
    KILN_CHECK(scales != nullptr && scales->dtype() == DType::kF32 && scales->numel() == out_,
               "node '{}': an {} weight's scales must be f32 [{}]", node_.name,
               fp8_ ? "f8_e4m3" : "i8", out_);
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
    const auto elem = static_cast<int64_t>(dtype_bytes(dtype_, 1));
    const auto out_elem = static_cast<int64_t>(dtype_bytes(y.dtype(), 1));
    const bool gemv_fits = gemv_w8a8_fits(xp, w.raw(), in_);
    // How rows r0 .. r0 + count of y are stored (the GEMV and the GEMM's epilogue alike).
    auto store_rows = [&](int64_t r0, int64_t count) {
      W8a8Store o{};
      o.type = t;
      o.scales = static_cast<const float*>(scales->raw());
      o.x_scale = x_scale_;
      o.bias_type = float_type(bias ? bias->dtype() : dtype_);
      o.bias = bias ? bias->raw() : nullptr;
      o.residual =
          residual ? static_cast<const char*>(residual->raw()) + r0 * out_ * elem : nullptr;
      o.y = static_cast<char*>(y.raw()) + r0 * out_ * out_elem;
      o.y32 = widen_ ? static_cast<float*>(y.raw()) + r0 * out_ : nullptr;
      o.rows = count;
      o.out = out_;
      o.has_act = activation_.has_value();
      o.act = act_fn(activation_.value_or(Activation::kRelu));
      return o;
    };
    // Rows r0 .. r0 + count on the GEMV.
    auto gemv_rows = [&](int64_t r0, int64_t count) {
      KILN_CHECK(gemv_fits,
                 "node '{}': the {} GEMV needs x 16-byte and the weight 8-byte aligned (x at {}, "
                 "weight at {}), and cuBLASLt has no algorithm for these rows",
                 node_.name, fp8_ ? "fp8" : "W8A8", xp, w.raw());
      GemvW8a8Params p{};
      p.store = store_rows(r0, count);
      p.x = static_cast<const char*>(xp) + r0 * in_ * elem;
      p.w = w.raw();
      p.fp8 = fp8_;
      p.inv_scale = inv_scale_;
      p.in = in_;
      p.split = split_[count == 1 ? 0 : 1];
      launch_gemv_w8a8(p, ctx_.kernel_stream());
    };
    // Decode steps on the GEMV (KILN_CUDA_GEMV=0 sends them to cuBLASLt too, as the float and
    // int8-weight Linears do).
    if (n <= ctx_.options().w8a8_gemv_rows && gemv_fits && ctx_.options().gemv)
      return gemv_rows(0, n);
    auto* q = reinterpret_cast<int8_t*>(scratch + at.quantized);
    launch_quantize_rows(t, fp8_, xp, inv_scale_, q, n * in_, ctx_.kernel_stream());
    void* acc = scratch + at.acc;
    for (int64_t r0 = 0; r0 < n; r0 += chunk_rows_) {
      const int64_t rows_here = std::min(chunk_rows_, n - r0);
      // A chunk cuBLASLt has no algorithm for (its row count, its alignment) runs on the GEMV.
      const Plan* plan = gemm_plan(rows_here, q + r0 * in_, w.raw());
      if (plan == nullptr) {
        gemv_rows(r0, rows_here);
        continue;
      }
      const int32_t alpha_i = 1, beta_i = 0;
      const float alpha_f = 1.0f, beta_f = 0.0f;
      const void* alpha = fp8_ ? static_cast<const void*>(&alpha_f) : &alpha_i;
      const void* beta = fp8_ ? static_cast<const void*>(&beta_f) : &beta_i;
      ctx_.launch().note_library_launch();
      const cublasStatus_t st =
          cublasLtMatmul(ctx_.blas().handle(), desc_, alpha, w.raw(), plan->a, q + r0 * in_,
                         plan->b, beta, acc, plan->c, acc, plan->c, &plan->algo,
                         ctx_.blas().workspace(), ctx_.blas().workspace_bytes(), ctx_.stream());
      KILN_CHECK(st == CUBLAS_STATUS_SUCCESS,
                 "node '{}': cuBLASLt refused the {} [{}, {}] x [{}, {}]^T matmul: {}", node_.name,
                 fp8_ ? "fp8" : "int8", rows_here, in_, out_, in_, cublas_status_name(st));
      W8a8EpilogueParams e{};
      e.store = store_rows(r0, rows_here);
      e.acc = acc;
      e.float_acc = fp8_;
      launch_w8a8_epilogue(e, ctx_.kernel_stream());
    }
  }

 private:
  struct Plan {
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool ok = false;
  };

  // Layouts and the heuristic's first int8 (FP8) algorithm for n rows (one per row count and
  // operand alignment); null when cuBLASLt has none (the GEMV runs those rows).
  const Plan* gemm_plan(int64_t n, const void* x, const void* w) {
    const uint32_t align = pointer_alignment({x, w});
    const auto key = std::make_tuple(std::min(n, chunk_rows_), align);
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second.ok ? &it->second : nullptr;
    const int64_t m = std::get<0>(key);
    Plan p;
    const auto u = [](int64_t v) { return static_cast<uint64_t>(v); };
    const cudaDataType_t ab = fp8_ ? CUDA_R_8F_E4M3 : CUDA_R_8I;
    const cudaDataType_t cd = fp8_ ? CUDA_R_32F : CUDA_R_32I;
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.a, ab, u(in_), u(out_), in_));
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, ab, u(in_), u(m), in_));
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, cd, u(out_), u(m), out_));
    // The results start the scratch's 256-byte aligned slot.
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    const cublasStatus_t st = heuristic_algorithms(ctx_.blas().handle(), desc_, p.a, p.b, p.c,
                                                   ctx_.blas().workspace_bytes(),
                                                   {align, align, 256, 256}, 1, &result, &found);
    p.ok = st == CUBLAS_STATUS_SUCCESS && found > 0;
    if (p.ok) p.algo = result.algo;
    return plans_.emplace(key, p).first->second.ok ? &plans_.at(key) : nullptr;
  }

  int64_t in_ = 0, out_ = 0, chunk_rows_ = 256;
  DType dtype_ = DType::kF16;
  float x_scale_ = 0.0f, inv_scale_ = 0.0f;
  std::optional<Activation> activation_;
  bool widen_ = false, gather_ = false, has_bias_ = false;
  bool fp8_ = false;  // E4M3 weights and inputs (fp8 plans)
  SymShape y_shape_;
  int split_[2] = {1, 1};  // one row; slices of 8
  cublasLtMatmulDesc_t desc_ = nullptr;
  std::map<std::tuple<int64_t, uint32_t>, Plan> plans_;
};

}  // namespace

std::unique_ptr<Kernel> make_w8a8_linear_kernel(const Node& node, CudaContext& ctx) {
  return std::make_unique<W8a8LinearKernel>(node, ctx);
}

}  // namespace kiln::cuda
