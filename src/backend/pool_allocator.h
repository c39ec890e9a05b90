// Buffers carved out of large host chunks, kept for later buffers when freed: a T5 request's
// cross K/V (2.9 MB for flan-t5-base in bf16) from the host allocator is rounded up to whole
// 2 MB huge pages (4 MB), and 16 requests left 18 MiB resident for nothing; buffers of their
// exact size (64-byte aligned) from chunks in huge pages lose at most a page per chunk, and a
// chunk stays mapped and resident for the next requests (no page faults per request) until
// shrink() gives back those wholly free. Buffers hold the pool's state alive, so they may
// outlive the PoolAllocator. Thread-safe.
#pragma once

#include <cstddef>
#include <memory>

#include "backend/backend.h"

namespace kiln {

class PoolAllocator final : public Allocator {
 public:
  // Chunks of `chunk_bytes` (or one buffer's size, if larger) from `base`, a host allocator.
  explicit PoolAllocator(Allocator& base, size_t chunk_bytes = size_t{32} << 20);
  Device device() const override { return Device::kCpu; }
  // Zero-filled, 64-byte aligned, exactly `bytes` (rounded up to 64) of a chunk.
  std::shared_ptr<void> allocate(size_t bytes) override;
  Tensor upload(const Tensor& host) override { return host.clone(); }
  // Gives the chunks no buffer uses back to `base`; returns their bytes.
  size_t shrink();
  // Bytes of the chunks held, and of the buffers in use (each rounded up to 64).
  size_t chunk_bytes() const;
  size_t used_bytes() const;

  struct State;  // the chunks and their free ranges (shared with the buffers' deleters)

 private:
  std::shared_ptr<State> state_;
};

}  // namespace kiln
