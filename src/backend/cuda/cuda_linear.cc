// Linear: up to kGemvMaxRows rows (decode) on kiln's GEMV (gemv.cu), which streams the weights
// at HBM speed where cuBLASLt's GEMMs spend 10-50 us on a single row; more rows on cuBLASLt:
// y [n, out] = x [n, in] · w [out, in]^T (+ bias) (then the fused
// activation). Row-major y is column-major y^T [out, n] = w · x^T, so A = w (transposed),
// B = x. fp16/bf16 multiply with fp32 accumulation; fp32 stays fp32 (no TF32). The bias rides
// on cuBLASLt's bias epilogue when it has the output's type; the activation (and a bias of
// another type) is one elementwise kernel after the GEMM. One algorithm per token count:
// cuBLASLt's heuristic's first, or (KILN_CUDA_TUNE_GEMM) the fastest of its candidates timed
// the first time that count runs.
#include <map>

#include "backend/cuda/cuda_kernels.h"

namespace kiln::cuda {
namespace {

cudaDataType_t cuda_type(DType dtype) {
  switch (float_type(dtype)) {
    case FloatType::kF32:
      return CUDA_R_32F;
    case FloatType::kF16:
      return CUDA_R_16F;
    case FloatType::kBF16:
      return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

class LinearKernel final : public CudaKernel {
 public:
  using CudaKernel::CudaKernel;
  ~LinearKernel() override {
    for (auto& [n, plan] : plans_) {
      cublasLtMatrixLayoutDestroy(plan.b);
      cublasLtMatrixLayoutDestroy(plan.c);
    }
    if (a_ != nullptr) cublasLtMatrixLayoutDestroy(a_);
    if (desc_ != nullptr) cublasLtMatmulDescDestroy(desc_);
  }

  void prepare(const Graph& graph) override {
    CudaKernel::prepare(graph);
    const Value& w = graph.values[node_.inputs[1]];
    const Value& y = graph.values[node_.outputs[0]];
    KILN_CHECK(w.shape.size() == 2 && !w.shape[0].is_symbolic() && !w.shape[1].is_symbolic(),
               "node '{}': the cuda linear needs a [out, in] weight of fixed shape", node_.name);
    KILN_CHECK(w.dtype == y.dtype, "node '{}': the cuda linear multiplies {} weights into {}",
               node_.name, dtype_name(w.dtype), dtype_name(y.dtype));
    KILN_CHECK(node_.inputs.size() < 4 || node_.inputs[3] < 0,
               "node '{}': the cuda linear takes no per-channel scales", node_.name);
    out_ = w.shape[0].value;
    in_ = w.shape[1].value;
    dtype_ = y.dtype;
    activation_ = node_.attr<LinearAttrs>().activation;
    const bool has_bias = node_.inputs.size() > 2 && node_.inputs[2] >= 0;
    bias_in_epilogue_ = has_bias && graph.values[node_.inputs[2]].dtype == dtype_;
    bias_after_ = has_bias && !bias_in_epilogue_;
    gemv_split_ = gemv_split(float_type(dtype_), in_, out_, ctx_.multiprocessors());

    KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc_, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a,
                                                     sizeof(trans_a)));
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b,
                                                     sizeof(trans_b)));
    if (bias_in_epilogue_) {
      const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
      KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_EPILOGUE,
                                                       &epilogue, sizeof(epilogue)));
      const cudaDataType_t bias_type = cuda_type(dtype_);
      KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                       &bias_type, sizeof(bias_type)));
    }
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&a_, cuda_type(dtype_), static_cast<uint64_t>(in_),
                                                 static_cast<uint64_t>(out_), in_));
  }

  void run(const KernelArgs& args) override {
    const Tensor& x = args.in[0];
    const Tensor& w = args.in[1];
    Tensor& y = args.out[0];
    KILN_CHECK(x.device() == Device::kCuda && w.device() == Device::kCuda,
               "node '{}': the cuda linear reads device memory", node_.name);
    KILN_CHECK(x.dtype() == dtype_ && x.numel() % in_ == 0,
               "node '{}': input {} {} does not fit a [n, {}] {} linear", node_.name,
               dtype_name(x.dtype()), shape_str(x.shape()), in_, dtype_name(dtype_));
    const int64_t n = x.numel() / in_;
    if (n == 0) return;
    const bool has_bias = bias_in_epilogue_ || bias_after_;
    // A residual add fused into this Linear (fuse_linear_residual): y = this + residual.
    const Tensor* residual = args.in.size() > kLinearResidual && args.in[kLinearResidual].defined()
                                 ? &args.in[kLinearResidual]
                                 : nullptr;
    KILN_CHECK(residual == nullptr ||
                   (residual->dtype() == dtype_ && residual->numel() == n * out_ && !activation_),
               "node '{}': a fused residual must be a {} [{}, {}] tensor, after no activation",
               node_.name, dtype_name(dtype_), n, out_);
    if (n <= kGemvMaxRows && ctx_.use_gemv() &&
        gemv_fits(float_type(dtype_), x.raw(), w.raw(), in_)) {
      const Tensor* bias = has_bias ? &args.in[2] : nullptr;
      launch_gemv(float_type(dtype_), x.raw(), w.raw(), float_type(bias ? bias->dtype() : dtype_),
                  bias ? bias->raw() : nullptr, residual ? residual->raw() : nullptr, y.raw(), n,
                  in_, out_, gemv_split_, activation_.has_value(),
                  act_fn(activation_.value_or(Activation::kRelu)), ctx_.stream());
      return;
    }
    if (bias_in_epilogue_) {
      const void* bias = args.in[2].raw();
      KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                       &bias, sizeof(bias)));
    }
    const Plan& plan = plan_for(n, x.raw(), w.raw(), y.raw());
    // D = w·x + beta·C (+ bias): C is the fused residual, or y itself with beta 0.
    const float alpha = 1.0f, beta = residual ? 1.0f : 0.0f;
    const void* c = residual ? residual->raw() : y.raw();
    KILN_CUBLAS_CHECK(cublasLtMatmul(
        ctx_.blas(), desc_, &alpha, w.raw(), a_, x.raw(), plan.b, &beta, c, plan.c, y.raw(), plan.c,
        &plan.algo, ctx_.blas_workspace(), ctx_.blas_workspace_bytes(), ctx_.stream()));
    if (bias_after_ || activation_) {
      const Tensor* bias = bias_after_ ? &args.in[2] : nullptr;
      launch_bias_activation(float_type(dtype_), y.raw(),
                             bias ? float_type(bias->dtype()) : float_type(dtype_),
                             bias ? bias->raw() : nullptr, n, out_, activation_.has_value(),
                             act_fn(activation_.value_or(Activation::kRelu)), ctx_.stream());
    }
  }

 private:
  struct Plan {
    cublasLtMatrixLayout_t b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
  };

  // The algorithm for n rows: cuBLASLt's heuristic proposes up to kCandidates, and each is
  // timed (CUDA events, after a warm-up) on this node's own operands the first time n rows
  // run; the fastest is kept (TensorRT's tactic selection, at run time).
  const Plan& plan_for(int64_t n, const void* x, const void* w, void* y) {
    auto it = plans_.find(n);
    if (it != plans_.end()) return it->second;
    Plan p;
    const cudaDataType_t t = cuda_type(dtype_);
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, t, static_cast<uint64_t>(in_),
                                                 static_cast<uint64_t>(n), in_));
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, t, static_cast<uint64_t>(out_),
                                                 static_cast<uint64_t>(n), out_));
    cublasLtMatmulPreference_t pref = nullptr;
    KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    const size_t ws = ctx_.blas_workspace_bytes();
    KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
        pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws)));
    constexpr int kCandidates = 8;
    cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
    int found = 0;
    const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(ctx_.blas(), desc_, a_, p.b, p.c, p.c,
                                                             pref, kCandidates, results, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
      cublasLtMatrixLayoutDestroy(p.b);
      cublasLtMatrixLayoutDestroy(p.c);
      KILN_FAIL(
          "node '{}': cuBLASLt has no algorithm for a {} linear of [{}, {}] x [{}, {}]^T "
          "({})",
          node_.name, dtype_name(dtype_), n, in_, out_, in_, cublas_status_name(st));
    }
    p.algo = results[0].algo;
    // Timing the candidates on a warm L2 (the node's weights stay cached across repetitions)
    // picked slower algorithms than the heuristic's first for decode, where weights stream from
    // HBM; until the timing flushes L2 between repetitions, it is opt-in.
    if (found > 1 && ctx_.tune_gemms()) {
      cudaEvent_t start = nullptr, stop = nullptr;
      KILN_CUDA_CHECK(cudaEventCreate(&start));
      KILN_CUDA_CHECK(cudaEventCreate(&stop));
      const float alpha = 1.0f, beta = 0.0f;
      float best = 0.0f, first = 0.0f;
      int chosen = 0;
      for (int i = 0; i < found; ++i) {
        auto launch = [&] {
          return cublasLtMatmul(ctx_.blas(), desc_, &alpha, w, a_, x, p.b, &beta, y, p.c, y, p.c,
                                &results[i].algo, ctx_.blas_workspace(),
                                ctx_.blas_workspace_bytes(), ctx_.stream());
        };
        if (results[i].state != CUBLAS_STATUS_SUCCESS || launch() != CUBLAS_STATUS_SUCCESS)
          continue;
        KILN_CUDA_CHECK(cudaEventRecord(start, ctx_.stream()));
        for (int r = 0; r < 5; ++r) KILN_CUBLAS_CHECK(launch());
        KILN_CUDA_CHECK(cudaEventRecord(stop, ctx_.stream()));
        KILN_CUDA_CHECK(cudaEventSynchronize(stop));
        float ms = 0.0f;
        KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        if (i == 0) first = ms;
        if (i == 0 || ms < best) {
          best = ms;
          chosen = i;
        }
      }
      cudaEventDestroy(start);
      cudaEventDestroy(stop);
      p.algo = results[chosen].algo;
      ctx_.host().log().debug(
          "node '{}': {} rows: cuBLASLt algorithm {} of {} ({:.1f} us; the heuristic's first "
          "{:.1f} us)",
          node_.name, n, chosen, found, best * 1000.0f / 5, first * 1000.0f / 5);
    }
    return plans_.emplace(n, p).first->second;
  }

  int64_t in_ = 0, out_ = 0;
  DType dtype_ = DType::kF32;
  std::optional<Activation> activation_;
  bool bias_in_epilogue_ = false, bias_after_ = false;
  int gemv_split_ = 1;
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr;
  std::map<int64_t, Plan> plans_;
};

}  // namespace

std::unique_ptr<Kernel> make_linear_kernel(const Node& node, CudaContext& ctx) {
  return std::make_unique<LinearKernel>(node, ctx);
}

}  // namespace kiln::cuda
