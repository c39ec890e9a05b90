#include "runtime/kv_cache.h"

#include <cstring>

#include "core/status.h"

namespace kiln {

PagedKvCache::PagedKvCache(int layers, int64_t row_width, int block_size, int blocks_per_chunk)
    : layers_(layers),
      row_width_(row_width),
      block_size_(block_size),
      blocks_per_chunk_(blocks_per_chunk),
      block_floats_(static_cast<int64_t>(layers) * 2 * block_size * row_width) {
  KILN_CHECK(layers > 0 && row_width > 0 && block_size > 0 && blocks_per_chunk > 0,
             "invalid KV cache geometry: {} layers, row width {}, block size {}", layers, row_width,
             block_size);
}

float* PagedKvCache::block_base(int32_t block) {
  KILN_CHECK(block >= 0 && block < static_cast<int32_t>(refcount_.size()),
             "KV block {} does not exist", block);
  return chunks_[block / blocks_per_chunk_].get() + (block % blocks_per_chunk_) * block_floats_;
}

float* PagedKvCache::key_block(int layer, int32_t block) {
  return block_base(block) + static_cast<int64_t>(layer) * 2 * block_size_ * row_width_;
}

float* PagedKvCache::value_block(int layer, int32_t block) {
  return block_base(block) + (static_cast<int64_t>(layer) * 2 + 1) * block_size_ * row_width_;
}

int32_t PagedKvCache::allocate() {
  if (free_.empty()) {
    // Grow by one chunk; existing blocks never move.
    const int32_t first = static_cast<int32_t>(refcount_.size());
    chunks_.push_back(
        std::make_unique<float[]>(static_cast<size_t>(blocks_per_chunk_ * block_floats_)));
    refcount_.resize(refcount_.size() + blocks_per_chunk_, 0);
    for (int32_t b = first + blocks_per_chunk_ - 1; b >= first; --b) free_.push_back(b);
  }
  const int32_t b = free_.back();
  free_.pop_back();
  refcount_[b] = 1;
  ++in_use_;
  return b;
}

void PagedKvCache::retain(int32_t block) {
  KILN_CHECK(refcount_.at(block) > 0, "retain of free KV block {}", block);
  ++refcount_[block];
}

void PagedKvCache::release(int32_t block) {
  KILN_CHECK(refcount_.at(block) > 0, "release of free KV block {}", block);
  if (--refcount_[block] == 0) {
    free_.push_back(block);
    --in_use_;
  }
}

int32_t PagedKvCache::copy(int32_t block) {
  const int32_t fresh = allocate();
  std::memcpy(block_base(fresh), block_base(block), block_floats_ * sizeof(float));
  return fresh;
}

int64_t PagedKvCache::bytes_allocated() const {
  return static_cast<int64_t>(chunks_.size()) * blocks_per_chunk_ * block_floats_ * 4;
}

void SequenceKv::prepare_append(PagedKvCache& cache, int64_t n) {
  const int bs = cache.block_size();
  const int64_t end = length_ + n;
  // The partly filled last block may be shared with a sibling beam: copy it before writing.
  if (n > 0 && length_ % bs != 0) {
    int32_t& last = blocks_[length_ / bs];
    if (cache.refcount(last) > 1) {
      const int32_t fresh = cache.copy(last);
      cache.release(last);
      last = fresh;
    }
  }
  while (static_cast<int64_t>(blocks_.size()) * bs < end) blocks_.push_back(cache.allocate());
}

SequenceKv SequenceKv::fork(PagedKvCache& cache) const {
  SequenceKv s;
  s.blocks_ = blocks_;
  s.length_ = length_;
  for (int32_t b : blocks_) cache.retain(b);
  return s;
}

void SequenceKv::release(PagedKvCache& cache) {
  for (int32_t b : blocks_) cache.release(b);
  blocks_.clear();
  length_ = 0;
}

}  // namespace kiln
