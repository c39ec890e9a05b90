// Linear: decode's few rows on kiln's GEMV (gemv.cu), which streams the weights at HBM speed
// where cuBLASLt's GEMMs spend 10-50 us on a single row; a batched decode step's rows (up to
// kSkinnyMaxRows, fp16/bf16) on kiln's skinny tensor-core GEMM (skinny_gemm.cu), which starts
// streaming its weights before the kernel before it ends; more rows on cuBLASLt:
// y [n, out] = x [n, in] · w [out, in]^T (+ bias) (then the fused
// activation). Row-major y is column-major y^T [out, n] = w · x^T, so A = w (transposed),
// B = x. fp16/bf16 multiply with fp32 accumulation; fp32 stays fp32 unless the node allows TF32
// (`kiln build --tf32`). The bias rides on cuBLASLt's bias epilogue when it has the output's
// type; the activation (and a bias of another type) is one elementwise kernel after the GEMM.
// Which kernel and cuBLASLt algorithm run for n rows: the node's tactic for n, timed at build
// time (time_linear_tactics, below; tactic_for_rows), or without one GEMV up to
// kGemvDefaultRows (CudaOptions::gemv_rows), the skinny GEMM up to kSkinnyDefaultRows
// (CudaOptions::skinny_rows) and cuBLASLt's heuristic's first algorithm above. A
// folded input norm (fuse_norm_linear) rides in a one-row GEMV, which sums the row while it streams
// the weights and applies mean and 1 / std after the product; before other GEMVs and GEMMs
// the norm kernel (unit weight, no bias) writes the standardized rows to the node's scratch memory.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <optional>

#include "backend/cuda/cuda_kernels.h"
#include "graph/workspace.h"

namespace kiln::cuda {
namespace {

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
    const LinearDesc d = describe_linear(node_);
    const Value& w = graph.values[d.operand(LinearOperand::kWeight)];
    // A widened Linear (fuse_linear_cast) computes in its input's type and stores f32.
    widen_ = d.epilogue.widen;
    const Value& y = graph.values[node_.outputs[0]];
    const DType yt = widen_ ? graph.values[d.operand(LinearOperand::kX)].dtype : y.dtype;
    KILN_CHECK(w.shape.size() == 2 && !w.shape[0].is_symbolic() && !w.shape[1].is_symbolic(),
               "node '{}': the cuda linear needs a [out, in] weight of fixed shape", node_.name);
    KILN_CHECK(w.dtype == yt, "node '{}': the cuda linear multiplies {} weights into {}",
               node_.name, dtype_name(w.dtype), dtype_name(yt));
    KILN_CHECK(!widen_ || y.dtype == DType::kF32, "node '{}': a widened linear stores f32, not {}",
               node_.name, dtype_name(y.dtype));
    KILN_CHECK(!d.has(LinearOperand::kWeightScales),
               "node '{}': the cuda linear takes no per-channel scales", node_.name);
    out_ = w.shape[0].value;
    in_ = w.shape[1].value;
    dtype_ = yt;
    activation_ = d.epilogue.activation;
    const bool has_bias = d.has(LinearOperand::kBias);
    bias_in_epilogue_ = has_bias && graph.values[d.operand(LinearOperand::kBias)].dtype == dtype_;
    bias_after_ = has_bias && !bias_in_epilogue_;
    for (int n = 1; n <= kGemvMaxRows; ++n)
      gemv_split_[n] = gemv_split(float_type(dtype_), in_, out_, ctx_.device().multiprocessors,
                                  ctx_.gemv_warps_per_sm(n));
    gemv_norm_split_ = gemv_split(float_type(dtype_), in_, out_, ctx_.device().multiprocessors,
                                  ctx_.gemv_norm_warps_per_sm());
    // The wide one-row GEMV where the standard one's many small blocks would not all find room
    // beside the kernel before it (another Linear's GEMV: BLOOM's q/k/v, dense_h_to_4h and
    // dense_4h_to_h), and its own grid still has a block for half the SMs or more. Behind a
    // small kernel (a norm, attention, T5's gated activation) the standard grid is resident at
    // once, and the wide one measured slower there (flan-t5-large); docs/performance-cuda.md.
    const bool after_linear =
        node_index_ > 0 && static_cast<size_t>(node_index_) < graph.nodes.size() &&
        graph.nodes[static_cast<size_t>(node_index_) - 1].op == OpKind::kLinear;
    const int64_t wide_blocks = gemv_wide_blocks(float_type(dtype_), in_, out_);
    gemv_wide_ =
        ctx_.options().gemv_wide == 2 || (ctx_.options().gemv_wide == 1 && after_linear &&
                                          2 * wide_blocks >= ctx_.device().multiprocessors);

    const LinearAttrs& attrs = node_.attr<LinearAttrs>();
    norm_ = d.epilogue.norm;
    norm_eps_ = static_cast<float>(d.epilogue.norm_eps);
    y_shape_ = graph.values[node_.outputs[0]].shape;
    gather_ = d.has(LinearOperand::kRows);
    norm_scaled_ = norm_ && d.has(LinearOperand::kNormScale);
    if (norm_) {
      // The norm kernel's unit weight and zero bias, for the steps that standardize x first
      // (f32 with a norm scale: that is then the norm kernel's weight).
      const DType t = norm_scaled_ ? DType::kF32 : dtype_;
      unit_ = ctx_.weights().filled_vector(t, in_, 1.0f);
      zero_ = ctx_.weights().filled_vector(t, in_, 0.0f);
    }
    tactics_ = attrs.tactics;
    const cublasComputeType_t compute =
        dtype_ == DType::kF32 && attrs.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
    desc_ = make_linear_matmul_desc(
        compute, bias_in_epilogue_ ? std::optional(cublas_type(dtype_)) : std::nullopt);
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(
        &a_, cublas_type(dtype_), static_cast<uint64_t>(in_), static_cast<uint64_t>(out_), in_));
  }

  // Scratch, per output row: the gathered rows of x (a Linear of gathered rows, for the steps that
  // do not gather inside the GEMV), a folded norm's standardized rows (for the steps that do not
  // take it inside the GEMV), then a widened Linear's output in its own type (for the steps that
  // run cuBLASLt: cast after it), each 256-byte aligned.
  int64_t workspace_bytes(const Bindings& bindings) const override {
    const Shape shape = resolve_shape(y_shape_, bindings);
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return scratch_offsets(n / out_).end;
  }
  struct ScratchOffsets {
    int64_t gathered = 0, normed = 0, widened = 0, end = 0;
  };
  ScratchOffsets scratch_offsets(int64_t rows) const {
    auto bytes = [&](bool on, int64_t elems) -> int64_t {
      if (!on) return 0;
      return (static_cast<int64_t>(dtype_bytes(dtype_, static_cast<size_t>(elems))) + 255) / 256 *
             256;
    };
    ScratchOffsets s;
    s.normed = bytes(gather_, rows * in_);
    s.widened = s.normed + bytes(norm_.has_value(), rows * in_);
    s.end = s.widened + bytes(widen_, rows * out_);
    return s;
  }

  void run(const KernelArgs& args) override {
    const Tensor& x = *linear_input(args.in, LinearOperand::kX);
    const Tensor& w = *linear_input(args.in, LinearOperand::kWeight);
    Tensor& y = args.out[0];
    KILN_CHECK(x.device() == Device::kCuda && w.device() == Device::kCuda,
               "node '{}': the cuda linear reads device memory", node_.name);
    KILN_CHECK(x.dtype() == dtype_ && x.numel() % in_ == 0,
               "node '{}': input {} {} does not fit a [n, {}] {} linear", node_.name,
               dtype_name(x.dtype()), shape_str(x.shape()), in_, dtype_name(dtype_));
    // Output rows: x's, or (gathered) the rows input's.
    const Tensor* rows = gather_ ? linear_input(args.in, LinearOperand::kRows) : nullptr;
    KILN_CHECK(rows == nullptr || (rows->rank() == 1 && rows->device() == Device::kCuda &&
                                   (rows->dtype() == DType::kI64 || rows->dtype() == DType::kI32)),
               "node '{}': the rows a linear gathers must be a 1-d i64/i32 device tensor",
               node_.name);
    const int64_t n = rows != nullptr ? rows->numel() : x.numel() / in_;
    if (n == 0) return;
    const ScratchOffsets at = scratch_offsets(n);
    KILN_CHECK(at.end == 0 || args.scratch != nullptr, "node '{}': a linear without its scratch",
               node_.name);
    char* scratch = static_cast<char*>(args.scratch);
    const bool has_bias = bias_in_epilogue_ || bias_after_;
    // A residual add fused into this Linear (fuse_linear_residual): y = this + residual.
    const Tensor* residual = linear_input(args.in, LinearOperand::kResidual);
    KILN_CHECK(residual == nullptr ||
                   (residual->dtype() == dtype_ && residual->numel() == n * out_ && !activation_),
               "node '{}': a fused residual must be a {} [{}, {}] tensor, after no activation",
               node_.name, dtype_name(dtype_), n, out_);
    Operands o{x.raw(), w.raw(), has_bias ? linear_input(args.in, LinearOperand::kBias) : nullptr,
               residual ? residual->raw() : nullptr, y.raw()};
    if (rows != nullptr) {
      KILN_CHECK(residual == nullptr, "node '{}': gathered rows take no residual", node_.name);
      o.x_rows = {rows->raw(), index_type(rows->dtype()), x.numel() / in_, ctx_.checks().status(),
                  node_index_};
      o.gathered = scratch + at.gathered;
    }
    if (widen_) {
      KILN_CHECK(y.dtype() == DType::kF32 && residual == nullptr,
                 "node '{}': a widened linear stores f32, with no residual", node_.name);
      o.y32 = static_cast<float*>(y.raw());
      o.y = scratch + at.widened;
    }
    if (norm_) {
      const bool layer = *norm_ == InputNorm::kLayerNorm;
      const Tensor* sums = linear_input(args.in, LinearOperand::kNormRowSums);
      KILN_CHECK((sums != nullptr) == layer &&
                     (sums == nullptr || (sums->dtype() == DType::kF32 && sums->numel() == out_)),
                 "node '{}': a folded {} needs {}", node_.name, input_norm_name(*norm_),
                 layer ? "the weight's f32 row sums" : "no row sums");
      const Tensor* scale =
          norm_scaled_ ? linear_input(args.in, LinearOperand::kNormScale) : nullptr;
      KILN_CHECK(scale == nullptr || (scale->dtype() == DType::kF32 && scale->numel() == in_),
                 "node '{}': a folded norm's scale must be f32 [{}]", node_.name, in_);
      o.norm = {true, sums ? sums->raw() : nullptr, scratch + at.normed,
                scale ? scale->raw() : nullptr};
    }
    run_rows(n, o, tactic_for(n));
  }

  // Times the candidate kernels for each row count in `rows` on this node's weight (and bias):
  // GEMV where it applies and cuBLASLt's heuristic's candidates, each run after flushing L2 (the
  // weights stream from HBM, as in a real step), median of five. Returns the fastest per count.
  std::vector<LinearTactic> time_tactics(std::span<const int64_t> rows, const Tensor& w,
                                         const Tensor* bias, bool residual) {
    const int64_t max_rows = *std::max_element(rows.begin(), rows.end());
    auto buffer = [&](int64_t n) {
      std::shared_ptr<void> p =
          ctx_.allocator().allocate(dtype_bytes(dtype_, static_cast<size_t>(n)));
      KILN_CUDA_CHECK(cudaMemsetAsync(p.get(), 0x3C, dtype_bytes(dtype_, static_cast<size_t>(n)),
                                      ctx_.stream()));
      return p;
    };
    const auto x = buffer(max_rows * in_), y = buffer(max_rows * out_);
    const auto res = residual ? buffer(max_rows * out_) : nullptr;
    // A folded norm's row sums (zeros: any values time alike) and scratch.
    const size_t sums_bytes = static_cast<size_t>(out_) * sizeof(float);
    const auto sums = norm_ ? ctx_.allocator().allocate(sums_bytes) : nullptr;
    const auto normed = norm_ ? buffer(max_rows * in_) : nullptr;
    int l2 = 0;
    KILN_CUDA_CHECK(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, ctx_.device().ordinal));
    const size_t flush_bytes = 2 * static_cast<size_t>(std::max(l2, 1 << 20));
    const auto flush = ctx_.allocator().allocate(flush_bytes);
    cudaEvent_t start = nullptr, stop = nullptr;
    KILN_CUDA_CHECK(cudaEventCreate(&start));
    KILN_CUDA_CHECK(cudaEventCreate(&stop));
    const auto y32 =
        widen_ ? ctx_.allocator().allocate(static_cast<size_t>(max_rows * out_) * sizeof(float))
               : nullptr;
    Operands o{x.get(), w.raw(), bias, res.get(), y.get()};
    o.y32 = static_cast<float*>(y32.get());
    if (norm_)
      o.norm = {true, *norm_ == InputNorm::kLayerNorm ? sums.get() : nullptr, normed.get(),
                norm_scaled_ ? unit_.raw() : nullptr};
    // Median time of `launch` in microseconds; infinity when it fails.
    auto time = [&](auto&& launch) {
      for (int i = 0; i < 2; ++i)
        if (!launch()) return INFINITY;
      std::vector<float> us;
      for (int i = 0; i < 5; ++i) {
        KILN_CUDA_CHECK(cudaMemsetAsync(flush.get(), i, flush_bytes, ctx_.stream()));
        KILN_CUDA_CHECK(cudaEventRecord(start, ctx_.stream()));
        launch();
        KILN_CUDA_CHECK(cudaEventRecord(stop, ctx_.stream()));
        KILN_CUDA_CHECK(cudaEventSynchronize(stop));
        float ms = 0.0f;
        KILN_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
        us.push_back(ms * 1000.0f);
      }
      std::nth_element(us.begin(), us.begin() + 2, us.end());
      return us[2];
    };
    std::vector<LinearTactic> out;
    for (int64_t n : rows) {
      // The untuned choice (GEMV up to gemv_rows(), else the heuristic's first; the skinny GEMM,
      // from 9 rows up to skinny_rows(), is kept, below) is timed first
      // and kept unless another candidate beats it by kClearWin: one launch after an L2 flush is
      // a noisy measure (a 130 us lm_head GEMM timed faster here than the GEMV that runs faster
      // in real decode steps), so a tactic only overrides the default on a clear win.
      constexpr float kClearWin = 0.9f;
      std::vector<LinearTactic> timed;
      std::optional<LinearTactic> gemv;
      if (n <= kGemvMaxRows && ctx_.options().gemv &&
          gemv_fits(float_type(dtype_), x.get(), w.raw(), in_)) {
        const LinearTactic chosen{n, "gemv", "", 0.0f};
        gemv = LinearTactic{n, "gemv", "", time([&] {
                              run_rows(n, o, &chosen);
                              return true;
                            })};
      }
      std::optional<LinearTactic> skinny;
      if (ctx_.options().skinny_rows > 0 && skinny_applies(n, x.get(), w.raw())) {
        const LinearTactic chosen{n, "skinny", "", 0.0f};
        skinny = LinearTactic{n, "skinny", "", time([&] {
                                run_rows(n, o, &chosen);
                                return true;
                              })};
      }
      const bool gemv_first = gemv && n <= ctx_.options().gemv_rows;
      const bool skinny_default = !gemv_first && skinny && skinny_first(n);
      // Where the skinny GEMM is the untuned choice it stays: timed alone it cannot show the
      // overlap it is built for (its first weights load while the kernel before it ends), and
      // cuBLASLt, timed 10 % faster so for bloom-560m's dense_4h_to_h at 16 rows, made the
      // tuned plan's batch-16 step 0.90 ms against the untuned plan's 0.86 in the same run.
      if (skinny_default) {
        out.push_back(*skinny);
        continue;
      }
      if (gemv_first) timed.push_back(*gemv);
      const Plan& plan = plan_for(n, nullptr);
      for (const cublasLtMatmulAlgo_t& algo : plan.candidates) {
        const float us = time([&] {
          const Operands normed_o = standardize(n, o);
          if (!launch_gemm(n, normed_o, algo, plan, false)) return false;
          finish_widen(n, normed_o);
          return true;
        });
        if (std::isfinite(us)) timed.push_back({n, "cublaslt", algo_string(algo), us});
      }
      if (gemv && !gemv_first) timed.push_back(*gemv);
      if (skinny) timed.push_back(*skinny);
      KILN_CHECK(!timed.empty(), "node '{}': no kernel ran a {} linear of [{}, {}] x [{}, {}]^T",
                 node_.name, dtype_name(dtype_), n, in_, out_, in_);
      const LinearTactic* fastest = &timed.front();
      for (const LinearTactic& t : timed)
        if (t.us < fastest->us) fastest = &t;
      out.push_back(fastest->us < kClearWin * timed.front().us ? *fastest : timed.front());
    }
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    KILN_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream()));
    return out;
  }

 private:
  struct Plan {
    cublasLtMatrixLayout_t b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    std::vector<cublasLtMatmulAlgo_t> candidates;  // the heuristic's, best first
  };
  struct NormOperands {
    bool on = false;                 // a folded norm
    const void* row_sums = nullptr;  // f32 [out]; null: RMSNorm
    void* scratch = nullptr;         // [n, in] of the activations' type, for standardize()
    const void* scale = nullptr;     // f32 [in]: gamma, multiplied into x (operand kNormScale)
  };
  struct Operands {
    const void* x;
    const void* w;
    const Tensor* bias;
    const void* residual;
    void* y;
    NormOperands norm{};
    // A widened Linear's f32 output (y is then its rows in dtype_, for cuBLASLt: finish_widen).
    float* y32 = nullptr;
    // A Linear of gathered rows: x's rows x_rows.index[] (x has x_rows.table_rows rows), copied
    // into `gathered` ([n, in]) where the GEMV does not read them itself.
    RowIndex x_rows{};
    void* gathered = nullptr;
  };

  // n rows on the GEMV, which takes a folded norm itself where it can, on the skinny GEMM, which
  // reads gathered rows itself, or on cuBLASLt.
  void run_rows(int64_t n, const Operands& o, const LinearTactic* tactic) {
    if (gemv_runs(n, o.x, o.w, tactic) && (!o.norm.on || ctx_.options().gemv_norm) &&
        launch_gemv_for(n, o))
      return;
    if (!o.norm.on && skinny_runs(n, o.x, o.w, tactic)) {
      launch_skinny_for(n, o);
      return;
    }
    const Operands plain = standardize(n, gather(n, o));
    if (gemv_runs(n, plain.x, plain.w, tactic)) {
      launch_gemv_for(n, plain);
      return;
    }
    if (skinny_runs(n, plain.x, plain.w, tactic)) {
      launch_skinny_for(n, plain);
      return;
    }
    const Plan& plan = plan_for(n, tactic);
    launch_gemm(n, plain, plan.algo, plan);
    finish_widen(n, plain);
  }

  // After cuBLASLt: a widened Linear's rows, in dtype_ in o.y, cast to f32 into o.y32.
  void finish_widen(int64_t n, const Operands& o) {
    if (o.y32 != nullptr)
      launch_cast(float_type(dtype_), FloatType::kF32, o.y, o.y32, n * out_, ctx_.kernel_stream());
  }

  // The operands with a gathered Linear's rows copied into its scratch (o itself without rows).
  Operands gather(int64_t n, const Operands& o) {
    if (o.x_rows.index == nullptr) return o;
    launch_gather_rows(float_type(dtype_), o.x, o.x_rows.table_rows, in_, o.x_rows.type,
                       o.x_rows.index, n, o.gathered, o.x_rows.status, o.x_rows.node,
                       ctx_.kernel_stream());
    Operands plain = o;
    plain.x = o.gathered;
    plain.x_rows = {};
    return plain;
  }

  // The operands with a folded norm's rows standardized into the scratch memory by the norm
  // kernel with unit weight (the norm scale where the Linear has one) and zero bias ((x - mean)
  // / std, or x / rms): the folded weight and bias do the rest. o itself without a folded norm.
  Operands standardize(int64_t n, const Operands& o) {
    if (!o.norm.on) return o;
    const FloatType t = float_type(dtype_);
    const FloatType wt = o.norm.scale != nullptr ? FloatType::kF32 : t;
    const void* w = o.norm.scale != nullptr ? o.norm.scale : unit_.raw();
    if (o.norm.row_sums != nullptr)
      launch_layer_norm(t, wt, o.x, w, zero_.raw(), o.norm.scratch, n, in_, norm_eps_,
                        ctx_.kernel_stream());
    else
      launch_rms_norm(t, wt, o.x, w, o.norm.scratch, n, in_, norm_eps_, ctx_.kernel_stream());
    Operands plain = o;
    plain.x = o.norm.scratch;
    plain.norm = {};
    return plain;
  }

  // Whether n rows run on kiln's GEMV: few enough, operands that fit it, and the tactic for n
  // chose it (without one: up to gemv_rows()).
  bool gemv_runs(int64_t n, const void* x, const void* w, const LinearTactic* tactic) const {
    return n <= kGemvMaxRows && ctx_.options().gemv && gemv_fits(float_type(dtype_), x, w, in_) &&
           (tactic != nullptr ? tactic->kernel == "gemv" : n <= ctx_.options().gemv_rows);
  }

  // Whether n rows can run on the skinny GEMM: fp16/bf16 operands that fit it, a bias (if any) of
  // the activations' type.
  bool skinny_applies(int64_t n, const void* x, const void* w) const {
    return !bias_after_ && skinny_fits(float_type(dtype_), x, w, in_, n);
  }
  // Whether n rows run on it: it applies, it is not switched off (KILN_CUDA_SKINNY_ROWS=0) and
  // the tactic for n chose it (without one, skinny_first).
  bool skinny_runs(int64_t n, const void* x, const void* w, const LinearTactic* tactic) const {
    return ctx_.options().skinny_rows > 0 && skinny_applies(n, x, w) &&
           (tactic != nullptr ? tactic->kernel == "skinny" : skinny_first(n));
  }
  // The untuned choice: past the GEMV's rows (kGemvMaxRows), up to skinny_rows(). (Rows 6-8
  // stay on cuBLASLt untuned and timed against the GEMV and the skinny GEMM in tuned plans:
  // the skinny GEMM is measured at 16 rows, not there.)
  bool skinny_first(int64_t n) const { return n > kGemvMaxRows && n <= ctx_.options().skinny_rows; }

  void launch_skinny_for(int64_t n, const Operands& o) {
    SkinnyParams p{};
    p.type = float_type(dtype_);
    p.x = o.x;
    p.w = o.w;
    p.bias = o.bias ? o.bias->raw() : nullptr;
    p.residual = o.residual;
    p.y = o.y;
    p.y32 = o.y32;
    p.rows = n;
    p.in = in_;
    p.out = out_;
    p.has_act = activation_.has_value();
    p.act = act_fn(activation_.value_or(Activation::kRelu));
    p.x_rows = o.x_rows;
    p.sms = ctx_.device().multiprocessors;
    launch_skinny(p, ctx_.kernel_stream());
  }

  // The tactic for n rows (tactic_for_rows); null without tactics.
  const LinearTactic* tactic_for(int64_t n) const {
    return tactic_for_rows(tactics_, n, ctx_.options().inexact_tactics);
  }

  // False, launching nothing, when the GEMV cannot take o's folded norm.
  bool launch_gemv_for(int64_t n, const Operands& o) {
    GemvParams p{};
    p.type = float_type(dtype_);
    p.x = o.x;
    p.w = o.w;
    p.bias_type = float_type(o.bias ? o.bias->dtype() : dtype_);
    p.bias = o.bias ? o.bias->raw() : nullptr;
    p.residual = o.residual;
    p.y = o.y;
    p.rows = n;
    p.in = in_;
    p.out = out_;
    p.split =
        o.norm.on && n == 1 ? gemv_norm_split_ : gemv_split_[std::min<int64_t>(n, kGemvMaxRows)];
    p.has_act = activation_.has_value();
    p.act = act_fn(activation_.value_or(Activation::kRelu));
    p.norm = o.norm.on;
    p.norm_row_sums = o.norm.row_sums;
    p.norm_scale = static_cast<const float*>(o.norm.scale);
    p.norm_eps = norm_eps_;
    p.y32 = o.y32;
    p.x_rows = o.x_rows;
    p.wide = gemv_wide_;  // launch_gemv takes it at one row without a gather or norm scale
    return launch_gemv(p, ctx_.kernel_stream());
  }

  // D = w·x + beta·C (+ bias), C the fused residual or y itself with beta 0; then the bias of
  // another type and the activation. False (checked: throws) when cuBLASLt refuses.
  bool launch_gemm(int64_t n, const Operands& o, const cublasLtMatmulAlgo_t& algo, const Plan& plan,
                   bool checked = true) {
    if (bias_in_epilogue_) {
      const void* bias = o.bias->raw();
      KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc_, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                       &bias, sizeof(bias)));
    }
    const float alpha = 1.0f, beta = o.residual ? 1.0f : 0.0f;
    const void* c = o.residual ? o.residual : o.y;
    ctx_.launch()
        .note_library_launch();  // whether or not it enqueued: the next kiln launch is plain
    const cublasStatus_t st = cublasLtMatmul(
        ctx_.blas().handle(), desc_, &alpha, o.w, a_, o.x, plan.b, &beta, c, plan.c, o.y, plan.c,
        &algo, ctx_.blas().workspace(), ctx_.blas().workspace_bytes(), ctx_.stream());
    if (!checked && st != CUBLAS_STATUS_SUCCESS) return false;
    KILN_CHECK(st == CUBLAS_STATUS_SUCCESS,
               "node '{}': cuBLASLt refused its [{}, {}] x [{}, {}]^T {} matmul: {} (operand "
               "addresses x {}, w {}, y {})",
               node_.name, n, in_, out_, in_, dtype_name(dtype_), cublas_status_name(st), o.x, o.w,
               o.y);
    if (bias_after_ || activation_) {
      const Tensor* bias = bias_after_ ? o.bias : nullptr;
      launch_bias_activation(float_type(dtype_), o.y,
                             bias ? float_type(bias->dtype()) : float_type(dtype_),
                             bias ? bias->raw() : nullptr, n, out_, activation_.has_value(),
                             act_fn(activation_.value_or(Activation::kRelu)), ctx_.kernel_stream());
    }
    return true;
  }

  // "<cuBLASLt version>:<hex>": an algorithm is only meaningful to the cuBLASLt that made it.
  static std::string algo_string(const cublasLtMatmulAlgo_t& algo) {
    std::string s = std::to_string(cublasLtGetVersion()) + ":";
    char hex[3];
    for (uint64_t word : algo.data)
      for (int byte = 0; byte < 8; ++byte) {
        std::snprintf(hex, sizeof(hex), "%02x", static_cast<unsigned>((word >> (8 * byte)) & 0xFF));
        s += hex;
      }
    return s;
  }
  static bool parse_algo(const std::string& s, cublasLtMatmulAlgo_t* algo) {
    const std::string prefix = std::to_string(cublasLtGetVersion()) + ":";
    if (!s.starts_with(prefix) || s.size() != prefix.size() + 2 * sizeof(algo->data)) return false;
    for (size_t i = 0; i < sizeof(algo->data); ++i) {
      unsigned v = 0;
      if (std::sscanf(s.c_str() + prefix.size() + 2 * i, "%2x", &v) != 1) return false;
      algo->data[i / 8] = (i % 8 == 0 ? 0 : algo->data[i / 8]) | (uint64_t{v} << (8 * (i % 8)));
    }
    return true;
  }

  // The cuBLASLt layouts and algorithm for n rows: the tactic's algorithm when it was timed by
  // this cuBLASLt and it accepts n rows, else the heuristic's first (kept per n).
  const Plan& plan_for(int64_t n, const LinearTactic* tactic) {
    auto it = plans_.find(n);
    if (it != plans_.end()) return it->second;
    Plan p;
    const cudaDataType_t t = cublas_type(dtype_);
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.b, t, static_cast<uint64_t>(in_),
                                                 static_cast<uint64_t>(n), in_));
    KILN_CUBLAS_CHECK(cublasLtMatrixLayoutCreate(&p.c, t, static_cast<uint64_t>(out_),
                                                 static_cast<uint64_t>(n), out_));
    // Above gemm_row_bucket rows without a tactic: the algorithm chosen for the bucket's top row
    // count (a heuristic query made once per bucket), if cuBLASLt accepts it for n rows.
    const int64_t bucket = ctx_.options().gemm_row_bucket;
    if (bucket > 0 && n > bucket && (tactic == nullptr || tactic->kernel != "cublaslt")) {
      const int64_t top = (n + bucket - 1) / bucket * bucket;
      const Plan& shared = top == n ? p : plan_for(top, nullptr);
      cublasLtMatmulHeuristicResult_t check{};
      if (top != n &&
          cublasLtMatmulAlgoCheck(ctx_.blas().handle(), desc_, a_, p.b, p.c, p.c, &shared.algo,
                                  &check) == CUBLAS_STATUS_SUCCESS &&
          check.workspaceSize <= ctx_.blas().workspace_bytes()) {
        p.algo = shared.algo;
        p.candidates = shared.candidates;
        return plans_.emplace(n, std::move(p)).first->second;
      }
    }
    const size_t ws = ctx_.blas().workspace_bytes();
    // The heuristic assumes 256-byte aligned operands unless told: activations are only
    // kWorkspaceAlign-aligned in the arena (weights come from cudaMalloc: 256).
    const uint32_t activations_align = kWorkspaceAlign;
    constexpr int kCandidates = 8;
    cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
    int found = 0;
    const cublasStatus_t st =
        heuristic_algorithms(ctx_.blas().handle(), desc_, a_, p.b, p.c, ws,
                             {256, activations_align, activations_align, activations_align},
                             kCandidates, results, &found);
    if (st != CUBLAS_STATUS_SUCCESS || found == 0) {
      cublasLtMatrixLayoutDestroy(p.b);
      cublasLtMatrixLayoutDestroy(p.c);
      KILN_FAIL(
          "node '{}': cuBLASLt has no algorithm for a {} linear of [{}, {}] x [{}, {}]^T "
          "({})",
          node_.name, dtype_name(dtype_), n, in_, out_, in_, cublas_status_name(st));
    }
    for (int i = 0; i < found; ++i)
      if (results[i].state == CUBLAS_STATUS_SUCCESS) p.candidates.push_back(results[i].algo);
    p.algo = results[0].algo;
    cublasLtMatmulAlgo_t tuned{};
    cublasLtMatmulHeuristicResult_t check{};
    if (tactic != nullptr && tactic->kernel == "cublaslt") {
      if (parse_algo(tactic->algo, &tuned) &&
          cublasLtMatmulAlgoCheck(ctx_.blas().handle(), desc_, a_, p.b, p.c, p.c, &tuned, &check) ==
              CUBLAS_STATUS_SUCCESS &&
          check.workspaceSize <= ws) {
        p.algo = tuned;
      } else {
        ctx_.host().log().debug(
            "node '{}': {} rows: the plan's cuBLASLt algorithm does not apply here (timed by "
            "another cuBLASLt, or not for this row count): the heuristic's first runs",
            node_.name, n);
      }
    }
    return plans_.emplace(n, std::move(p)).first->second;
  }

  int64_t in_ = 0, out_ = 0;
  DType dtype_ = DType::kF32;
  std::optional<Activation> activation_;
  std::optional<InputNorm> norm_;
  bool norm_scaled_ = false;  // the folded norm's gamma is operand kNormScale
  bool widen_ = false;        // f32 output (LinearEpilogue::widen)
  float norm_eps_ = 0.0f;
  SymShape y_shape_;
  bool gather_ = false;  // operand kRows: the Linear of x's rows x[rows]
  // [in] of the activations' type (f32 with a norm scale): a folded norm's standardizing kernel
  Tensor unit_, zero_;
  bool bias_in_epilogue_ = false, bias_after_ = false;
  int gemv_split_[kGemvMaxRows + 1] = {};  // per row count (gemv_split)
  bool gemv_wide_ = false;                 // one-row steps take the wide GEMV (prepare)
  int gemv_norm_split_ = 1;                // one row with the folded norm inside the GEMV
  cublasLtMatmulDesc_t desc_ = nullptr;
  cublasLtMatrixLayout_t a_ = nullptr;
  std::vector<LinearTactic> tactics_;
  std::map<int64_t, Plan> plans_;
};

}  // namespace

std::unique_ptr<Kernel> make_linear_kernel(const Node& node, CudaContext& ctx) {
  return std::make_unique<LinearKernel>(node, ctx);
}

std::vector<LinearTactic> time_linear_tactics(const Graph& graph, const Node& node,
                                              CudaContext& ctx, std::span<const int64_t> rows) {
  LinearKernel kernel(node, ctx);
  kernel.prepare(graph);
  const LinearDesc d = describe_linear(node);
  const Tensor w =
      ctx.weights().device_weight(graph.values[d.operand(LinearOperand::kWeight)].data);
  const bool has_bias = d.has(LinearOperand::kBias);
  const Tensor bias =
      has_bias ? ctx.weights().device_weight(graph.values[d.operand(LinearOperand::kBias)].data)
               : Tensor();
  const bool residual = d.has(LinearOperand::kResidual);
  return kernel.time_tactics(rows, w, has_bias ? &bias : nullptr, residual);
}

}  // namespace kiln::cuda
