// The CUDA backend's context for one GPU: the device (its ordinal and properties), the options
// it runs with (CudaOptions, read once), and the parts that each do one job — the stream and
// launch policy (LaunchStream), device memory (CudaAllocator), cuBLASLt (CublasLt), the step's
// uploads (StepUploads) and deferred checks (StepChecks), and the device copies of the weights
// (WeightCache). Token selection's buffers are the backend's CudaTokenSelector's
// (cuda_select.h). One per backend; used by the engine thread only.
#pragma once

#include <string>

#include "backend/cuda/cublaslt_handle.h"
#include "backend/cuda/cuda_allocator.h"
#include "backend/cuda/cuda_common.h"
#include "backend/cuda/cuda_options.h"
#include "backend/cuda/launch_stream.h"
#include "backend/cuda/step_checks.h"
#include "backend/cuda/step_uploads.h"
#include "backend/cuda/weight_cache.h"

namespace kiln::cuda {

// The GPU a context runs on.
struct CudaDevice {
  int ordinal = 0;
  std::string name;
  int sm = 0;  // compute capability, major * 10 + minor
  int multiprocessors = 0;
  // Makes GPU `ordinal` the calling thread's current device and reads its properties; throws a
  // usage error when there is no such GPU or it is older than sm_80.
  static CudaDevice open(int ordinal);
};

class CudaContext {
 public:
  CudaContext(Context& host, int ordinal, const CudaOptions& options);
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  Context& host() { return host_; }
  const CudaDevice& device() const { return device_; }
  const CudaOptions& options() const { return options_; }
  LaunchStream& launch() { return launch_; }
  const LaunchStream& launch() const { return launch_; }
  // The stream every kernel and copy runs on, and the same with the launch policy for kiln's
  // kernel launchers (kernels.cuh).
  cudaStream_t stream() const { return launch_.stream(); }
  KernelStream kernel_stream() { return launch_.kernel_stream(); }
  CudaAllocator& allocator() { return allocator_; }
  CublasLt& blas() { return blas_; }
  StepChecks& checks() { return checks_; }
  StepUploads& uploads() { return uploads_; }
  const StepUploads& uploads() const { return uploads_; }
  WeightCache& weights() { return weights_; }

  // The warps per SM the GEMV's split aims at for `rows` rows: 16 at one row, 8 at more
  // (kGemvWarpsOneRow, kGemvWarpsMoreRows), or CudaOptions::gemv_warps at every row count.
  int gemv_warps_per_sm(int64_t rows) const {
    return options_.gemv_warps > 0 ? options_.gemv_warps
           : rows <= 1             ? kGemvWarpsOneRow
                                   : kGemvWarpsMoreRows;
  }
  // The same for a one-row GEMV with a folded norm (64 registers a thread: four blocks fill an
  // SM's registers, so fewer of its blocks fit beside the kernel before it):
  // CudaOptions::gemv_norm_warps, else gemv_warps_per_sm(1).
  int gemv_norm_warps_per_sm() const {
    return options_.gemv_norm_warps > 0 ? options_.gemv_norm_warps : gemv_warps_per_sm(1);
  }

 private:
  // Warps per SM of a GEMV (gemv_split). One row: 16 measured 4.6 % faster than 32 on
  // flan-t5-large's batch-1 decode step on the H200 (its gate/up GEMV takes 2 warps a feature
  // group instead of 4; bloom-560m's splits are the same at both), and the same as 8 and 12
  // within 1 %. Two rows and more (each row's sums in registers: 106+ a thread, two blocks an
  // SM): 8 leaves room on every SM for the next kernel's blocks to start and load their weights
  // early; batch-2 decode steps 0.83 -> 0.72 ms (bloom-560m), 0.95 -> 0.84 (flan-t5-large)
  // against 16 (bench/gpu/h200-2026-12-01w-gemv-warps-ab.log).
  static constexpr int kGemvWarpsOneRow = 16;
  static constexpr int kGemvWarpsMoreRows = 8;
  Context& host_;
  CudaDevice device_;
  CudaOptions options_;
  // In the order they are made; destroyed in reverse, the stream last.
  LaunchStream launch_;
  CudaAllocator allocator_;
  CublasLt blas_;
  StepChecks checks_;
  StepUploads uploads_;
  WeightCache weights_;
};

}  // namespace kiln::cuda
