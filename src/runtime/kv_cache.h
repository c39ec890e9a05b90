// Paged KV cache. Memory is a pool of fixed-size blocks allocated in chunks as sequences grow
// (nothing is reserved for the maximum length). A block holds `block_size` positions of every
// layer's keys and values. Sequences own block tables; blocks are reference counted so beams can
// share a prefix, and a shared block is copied before it is written (copy on write).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "backend/attention_batch.h"

namespace kiln {

class PagedKvCache final : public KvBlockStore {
 public:
  PagedKvCache(int layers, int64_t row_width, int block_size = 16, int blocks_per_chunk = 64);

  int block_size() const override { return block_size_; }
  int64_t row_width() const override { return row_width_; }
  float* key_block(int layer, int32_t block) override;
  float* value_block(int layer, int32_t block) override;

  int32_t allocate();
  void retain(int32_t block);
  void release(int32_t block);
  int refcount(int32_t block) const { return refcount_.at(block); }
  // A fresh block holding a copy of `block` (every layer).
  int32_t copy(int32_t block);

  int64_t blocks_in_use() const { return in_use_; }
  int64_t blocks_allocated() const { return static_cast<int64_t>(refcount_.size()); }
  int64_t bytes_allocated() const;

 private:
  float* block_base(int32_t block);

  int layers_;
  int64_t row_width_;
  int block_size_;
  int blocks_per_chunk_;
  int64_t block_floats_;
  std::vector<std::unique_ptr<float[]>> chunks_;
  std::vector<int> refcount_;
  std::vector<int32_t> free_;
  int64_t in_use_ = 0;
};

// One sequence's view of the cache: its block table and how many positions are filled.
class SequenceKv {
 public:
  SequenceKv() = default;
  SequenceKv(const SequenceKv&) = delete;
  SequenceKv& operator=(const SequenceKv&) = delete;
  SequenceKv(SequenceKv&&) noexcept = default;
  SequenceKv& operator=(SequenceKv&&) noexcept = default;

  int64_t length() const { return length_; }
  const std::vector<int32_t>& blocks() const { return blocks_; }
  // Makes positions [length, length + n) writable: allocates blocks and copies shared ones.
  void prepare_append(PagedKvCache& cache, int64_t n);
  // Records that the prepared positions were written.
  void commit(int64_t n) { length_ += n; }
  // A sequence sharing every block of this one (beam fork).
  SequenceKv fork(PagedKvCache& cache) const;
  void release(PagedKvCache& cache);

 private:
  std::vector<int32_t> blocks_;
  int64_t length_ = 0;
};

}  // namespace kiln
