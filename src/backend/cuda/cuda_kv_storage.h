// The paged KV cache in device memory: blocks in chunks of kBlocksPerChunk (one cudaMalloc
// each, so blocks never move when the storage grows), with a device table of every block's
// address that kernels index through the block table.
#pragma once

#include <vector>

#include "backend/cuda/cuda_context.h"

namespace kiln::cuda {

class CudaKvStorage final : public KvStorage {
 public:
  static constexpr int64_t kBlocksPerChunk = 64;

  CudaKvStorage(CudaContext& ctx, const KvGeometry& geometry);
  const KvGeometry& geometry() const override { return geometry_; }
  Device device() const override { return ctx_.allocator().device(); }
  int64_t capacity() const override {
    return static_cast<int64_t>(chunks_.size()) * kBlocksPerChunk;
  }
  void resize(int64_t blocks) override;
  int64_t bytes_allocated() const override { return capacity() * geometry_.block_bytes(); }
  void copy_blocks(std::span<const BlockCopy> copies) override;
  void* key_block(int layer, int32_t block) override;
  void* value_block(int layer, int32_t block) override;

  // What kernels need; valid until the next resize().
  DeviceKv device_view() const;

 private:
  char* base(int32_t block) const;
  int64_t layer_bytes() const;

  CudaContext& ctx_;
  KvGeometry geometry_;
  std::vector<std::shared_ptr<void>> chunks_;
  std::shared_ptr<void> table_;  // [capacity] block addresses, device memory
};

}  // namespace kiln::cuda
