#include "runtime/kv_cache.h"

#include "core/status.h"

namespace kiln {

BlockManager::BlockManager(KvStorage& storage, int64_t budget_blocks)
    : storage_(storage), budget_(budget_blocks) {
  KILN_CHECK(budget_blocks >= 0, "negative KV budget {}", budget_blocks);
  refcount_.assign(static_cast<size_t>(storage_.capacity()), 0);
  for (int32_t b = 0; b < static_cast<int32_t>(refcount_.size()); ++b) free_.insert(b);
}

int64_t BlockManager::available() const {
  if (budget_ == 0) return INT64_MAX;
  return budget_ - in_use_;
}

int32_t BlockManager::allocate() {
  KILN_CHECK(available() > 0, "KV cache budget of {} blocks is exhausted", budget_);
  if (free_.empty()) {
    const int64_t before = storage_.capacity();
    storage_.resize(before + 1);
    const int64_t after = storage_.capacity();
    refcount_.resize(static_cast<size_t>(after), 0);
    for (int64_t b = before; b < after; ++b) free_.insert(static_cast<int32_t>(b));
  }
  const int32_t b = *free_.begin();
  free_.erase(free_.begin());
  refcount_[b] = 1;
  ++in_use_;
  return b;
}

int BlockManager::refcount(int32_t block) const {
  KILN_CHECK(block >= 0 && block < static_cast<int32_t>(refcount_.size()),
             "KV block {} does not exist", block);
  return refcount_[block];
}

void BlockManager::retain(int32_t block) {
  KILN_CHECK(refcount(block) > 0, "retain of free KV block {}", block);
  ++refcount_[block];
}

void BlockManager::release(int32_t block) {
  KILN_CHECK(refcount(block) > 0, "release of free KV block {}", block);
  if (--refcount_[block] == 0) {
    free_.insert(block);
    --in_use_;
  }
}

int64_t BlockManager::shrink() {
  int64_t keep = static_cast<int64_t>(refcount_.size());
  while (keep > 0 && refcount_[keep - 1] == 0) --keep;
  storage_.resize(keep);
  const int64_t cap = storage_.capacity();  // rounded up to whole chunks
  for (int64_t b = cap; b < static_cast<int64_t>(refcount_.size()); ++b)
    free_.erase(static_cast<int32_t>(b));
  refcount_.resize(static_cast<size_t>(cap));
  return cap;
}

int64_t SequenceKv::blocks_needed(const BlockManager& m, int64_t n) const {
  const int bs = m.block_size();
  const int64_t end = length_ + n;
  int64_t need = (end + bs - 1) / bs - static_cast<int64_t>(blocks_.size());
  if (need < 0) need = 0;
  if (n > 0 && length_ % bs != 0 && m.refcount(blocks_[length_ / bs]) > 1) ++need;
  return need;
}

void SequenceKv::prepare_append(BlockManager& m, int64_t n, std::vector<BlockCopy>* copies) {
  const int bs = m.block_size();
  const int64_t end = length_ + n;
  // The partly filled last block may be shared with a sibling beam: write into a copy.
  if (n > 0 && length_ % bs != 0) {
    int32_t& last = blocks_[length_ / bs];
    if (m.refcount(last) > 1) {
      const int32_t fresh = m.allocate();
      copies->push_back(BlockCopy{last, fresh});
      m.release(last);
      last = fresh;
    }
  }
  while (static_cast<int64_t>(blocks_.size()) * bs < end) blocks_.push_back(m.allocate());
}

SequenceKv SequenceKv::fork(BlockManager& m) const {
  SequenceKv s;
  s.blocks_ = blocks_;
  s.length_ = length_;
  for (int32_t b : blocks_) m.retain(b);
  return s;
}

void SequenceKv::release(BlockManager& m) {
  for (int32_t b : blocks_) m.release(b);
  blocks_.clear();
  length_ = 0;
}

}  // namespace kiln
