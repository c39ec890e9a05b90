// The CUDA backend's context: the device, the stream every kernel and copy runs on, the
// cuBLASLt handle with its workspace, the status word kernels report bad data in, and the
// device copy of the step being executed. One per backend; used by the engine thread only.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <memory>
#include <string>

#include "backend/backend.h"
#include "backend/cuda/kernels.cuh"

namespace kiln::cuda {

// Throws a kiln::Error naming the call and the CUDA / cuBLAS error.
void check_cuda(cudaError_t err, const char* call, const char* file, int line);
const char* cublas_status_name(cublasStatus_t status);
void check_cublas(cublasStatus_t status, const char* call, const char* file, int line);
#define KILN_CUDA_CHECK(call) ::kiln::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define KILN_CUBLAS_CHECK(call) ::kiln::cuda::check_cublas((call), #call, __FILE__, __LINE__)

// The kernel-side element type of a float dtype; throws for others.
FloatType float_type(DType dtype);
IndexType index_type(DType dtype);

// Device memory; allocations are zero-filled and freed when the last tensor lets go.
class CudaAllocator final : public Allocator {
 public:
  explicit CudaAllocator(cudaStream_t stream) : stream_(stream) {}
  Device device() const override { return Device::kCuda; }
  std::shared_ptr<void> allocate(size_t bytes) override;
  // Host or device tensors (contiguous) to a new device tensor.
  Tensor upload(const Tensor& source) override;
  Tensor to_host(const Tensor& t) override;
  void copy_to_host(const Tensor& t, void* dst) override;

 private:
  cudaStream_t stream_;
};

class CudaContext {
 public:
  explicit CudaContext(Context& host);
  ~CudaContext();
  CudaContext(const CudaContext&) = delete;
  CudaContext& operator=(const CudaContext&) = delete;

  Context& host() { return host_; }
  cudaStream_t stream() const { return stream_; }
  cublasLtHandle_t blas() const { return blas_; }
  void* blas_workspace() const { return blas_workspace_; }
  size_t blas_workspace_bytes() const { return kBlasWorkspaceBytes; }
  CudaAllocator& allocator() { return allocator_; }
  const std::string& device_name() const { return device_name_; }
  int sm() const { return sm_; }
  // KILN_CUDA_PROFILE set (read once): executors time every node with CUDA events and log the
  // totals per kernel when they are destroyed.
  bool profile() const { return profile_; }
  // KILN_CUDA_TUNE_GEMM set (read once): Linear kernels time cuBLASLt's candidate algorithms
  // at first use instead of taking the heuristic's first.
  bool tune_gemms() const { return tune_gemms_; }

  DeviceStatus* status() { return status_; }
  // Waits for the stream, then throws if a kernel reported bad data (naming the node of
  // `graph`) and clears the status.
  void finish_step(const Graph& graph);

  // Uploads the step's layout (one copy) and makes it the current one kernels read.
  void upload_step(const StepLayout& layout);
  const DeviceStep& step() const { return step_; }

  // Row argmax of device logits into `out` (one small copy back).
  void argmax_rows(const Tensor& logits, std::span<int64_t> out);

  // The device copy of a weight, uploaded once per backend (graphs that share a weight share
  // the copy).
  Tensor device_weight(const Tensor& host);

 private:
  static constexpr size_t kBlasWorkspaceBytes = 32u << 20;
  Context& host_;
  int device_ = 0;
  int sm_ = 0;
  bool profile_ = false;
  bool tune_gemms_ = false;
  std::string device_name_;
  cudaStream_t stream_ = nullptr;
  cublasLtHandle_t blas_ = nullptr;
  void* blas_workspace_ = nullptr;
  DeviceStatus* status_ = nullptr;
  CudaAllocator allocator_{nullptr};
  // The step's layout: packed on the host (pinned), copied to device memory that grows only
  // when a step needs more than any before.
  void* step_host_ = nullptr;
  void* step_device_ = nullptr;
  size_t step_capacity_ = 0;
  DeviceStep step_{};
  // Keyed by the host bytes; the host tensor is kept so that its address is not reused.
  std::map<const void*, std::pair<Tensor, Tensor>> weights_;
  std::shared_ptr<void> argmax_device_;
  size_t argmax_capacity_ = 0;
};

}  // namespace kiln::cuda
