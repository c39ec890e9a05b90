// A CUDA context's device memory: a caching allocator on the context's stream, and the
// accounting of what kiln holds on the GPU (cuda_info.h's memory statistics).
#pragma once

#include <cuda_runtime.h>

#include <functional>
#include <memory>
#include <span>
#include <vector>

#include "backend/backend.h"
#include "backend/cuda/cuda_common.h"

namespace kiln::cuda {

// A library's fixed workspace (cuBLASLt's), counted in the statistics as the library's.
void* malloc_library_workspace(size_t bytes);
void free_library_workspace(void* p, size_t bytes);

// Device memory; allocations are zero-filled and given back when the last tensor lets go. Blocks
// up to kMaxCachedBlock bytes go to a cache instead of cudaFree (which waits for the whole device)
// and serve later requests of up to their size, so that per-request buffers (a T5 request's
// cross K/V, 2 x layers copies) cost no cudaMalloc once the cache is warm; 256 MB covers the KV
// cache's chunks of 64 blocks (96 MB for flan-t5-large and bloom-560m in 16-row blocks), so a new
// scheduler's cache costs no cudaMalloc either (~0.4 ms each on the H200). The cache holds at
// most kMaxCachedBytes and is emptied when the GPU runs out of memory. Work on the one stream
// is ordered, so a block freed while kernels still read it is only reused by later work.
class CudaAllocator final : public Allocator {
 public:
  // Device memory of GPU `ordinal` (the current device when it allocates).
  CudaAllocator(cudaStream_t stream, int ordinal);
  Device device() const override { return Device(Device::kCuda, ordinal_); }
  std::shared_ptr<void> allocate(size_t bytes) override;
  // The same without waiting: zero-filled in the stream's order, so only for memory that work
  // on the stream alone touches (the KV cache's chunks and block table).
  std::shared_ptr<void> allocate_in_order(size_t bytes);
  // Host or device tensors (contiguous) to a new device tensor. A device source is copied on
  // the stream without waiting for it.
  Tensor upload(const Tensor& source) override;
  Tensor to_host(const Tensor& t) override;
  void copy_to_host(const Tensor& t, void* dst) override;
  // Device parts: one launch of copy_parts (kernels_elementwise.cu) for all of them, in stream
  // order, without waiting for it; host parts are uploaded.
  std::vector<std::vector<Tensor>> copy_groups(
      std::span<const std::vector<Tensor>> groups) override;
  // The same from device sources, without a slice per part: one buffer per group, its tensors
  // views of it (Tensor::view_at), one launch of copy_parts.
  std::vector<std::vector<Tensor>> copy_row_groups(std::span<const Tensor> sources,
                                                   std::span<const int64_t> row_bounds) override;
  // Bytes held in the cache, free for reuse.
  size_t cached_bytes() const;
  // Uninitialized device memory of at least `bytes`, from the cache or cudaMalloc.
  std::shared_ptr<void> allocate_raw(size_t bytes);
  // Called after each copy to the host has been waited for (the context's pending step checks).
  void set_after_read(std::function<void()> after_read) { after_read_ = std::move(after_read); }

  static constexpr size_t kMaxCachedBlock = 256u << 20;
  static constexpr size_t kMaxCachedBytes = 2ull << 30;

 private:
  struct Cache;
  // One launch of copy_parts for `parts` (device sources and destinations), in stream order.
  void copy_parts(std::span<const CopyPart> parts);
  cudaStream_t stream_;
  int ordinal_;
  std::shared_ptr<Cache> cache_;
  std::function<void()> after_read_;
};

}  // namespace kiln::cuda
