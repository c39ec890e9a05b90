// The paged KV cache as the runtime sees it: integers only. The backend owns the storage (its
// dtype, its device); the BlockManager decides which blocks exist and who holds them. Blocks are
// reference counted so beams share a prefix; a shared block is copied before it is written (the
// copy is recorded in the step layout and made by the backend before the step runs). The
// storage grows in chunks up to a budget and shrinks back when blocks are freed.
#pragma once

#include <cstdint>
#include <set>
#include <vector>

#include "backend/kv_storage.h"

namespace kiln {

class BlockManager {
 public:
  // budget_blocks: the most blocks that may exist at once (0: no limit).
  BlockManager(KvStorage& storage, int64_t budget_blocks = 0);

  int block_size() const { return storage_.geometry().block_size; }
  int64_t budget() const { return budget_; }  // 0: unlimited
  int64_t in_use() const { return in_use_; }
  int64_t capacity() const { return storage_.capacity(); }
  // Blocks that can still be allocated without exceeding the budget.
  int64_t available() const;
  // Takes the lowest free block (so that the top of the storage empties and can shrink),
  // growing the storage when none is free. Throws when the budget is exhausted; callers check
  // available() first.
  int32_t allocate();
  void retain(int32_t block);
  void release(int32_t block);
  int refcount(int32_t block) const;
  // Returns trailing storage chunks that hold no block in use; returns the new capacity.
  int64_t shrink();
  KvStorage& storage() { return storage_; }

 private:
  KvStorage& storage_;
  int64_t budget_;
  std::vector<int> refcount_;  // per block of the storage's capacity
  std::set<int32_t> free_;     // ordered: allocation takes the lowest
  int64_t in_use_ = 0;
};

// One sequence's block table and how many positions are filled.
class SequenceKv {
 public:
  SequenceKv() = default;
  SequenceKv(const SequenceKv&) = delete;
  SequenceKv& operator=(const SequenceKv&) = delete;
  SequenceKv(SequenceKv&&) noexcept = default;
  SequenceKv& operator=(SequenceKv&&) noexcept = default;

  int64_t length() const { return length_; }
  const std::vector<int32_t>& blocks() const { return blocks_; }
  // Blocks prepare_append(n) would allocate (new blocks plus a copy of a shared last block).
  int64_t blocks_needed(const BlockManager& m, int64_t n) const;
  // Makes positions [length, length + n) writable: allocates blocks, and replaces a shared,
  // partly filled last block by a fresh one whose copy is appended to `copies`.
  void prepare_append(BlockManager& m, int64_t n, std::vector<BlockCopy>* copies);
  // Records that the prepared positions were written.
  void commit(int64_t n) { length_ += n; }
  // A sequence sharing every block of this one (beam fork).
  SequenceKv fork(BlockManager& m) const;
  // Frees every block (preemption, finish, cancel); the length becomes 0.
  void release(BlockManager& m);

 private:
  std::vector<int32_t> blocks_;
  int64_t length_ = 0;
};

}  // namespace kiln
