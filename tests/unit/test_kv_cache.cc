// The runtime's block manager over the CPU backend's KV storage: chunked growth, reuse, copy on
// write through the step's copy list, the budget, and shrinking.
#include <gtest/gtest.h>

#include "backend/backend.h"
#include "runtime/kv_cache.h"

namespace kiln {
namespace {

class KvCacheTest : public testing::Test {
 protected:
  std::unique_ptr<KvStorage> storage(int layers, int64_t width, int block_size) {
    return backend_->create_kv_storage(KvGeometry{layers, width, block_size, DType::kF32});
  }
  Context ctx_{ContextOptions{LogLevel::kError, 1}};
  std::unique_ptr<Backend> backend_ = make_cpu_backend(ctx_);
};

TEST_F(KvCacheTest, GrowsByChunksAndReusesFreedBlocks) {
  auto s = storage(2, 8, 4);
  BlockManager m(*s);
  EXPECT_EQ(s->bytes_allocated(), 0) << "nothing is reserved up front";
  std::vector<BlockCopy> copies;
  SequenceKv a;
  a.prepare_append(m, 9, &copies);  // 9 positions → 3 blocks of 4
  a.commit(9);
  EXPECT_EQ(a.blocks().size(), 3u);
  EXPECT_EQ(m.in_use(), 3);
  const int64_t chunk = m.capacity();
  EXPECT_GE(chunk, 3);
  a.release(m);
  EXPECT_EQ(m.in_use(), 0);
  SequenceKv b;
  b.prepare_append(m, 12, &copies);
  EXPECT_EQ(m.capacity(), chunk) << "freed blocks are reused before growing";
  EXPECT_EQ(b.blocks(), (std::vector<int32_t>{0, 1, 2})) << "lowest free blocks first";
  b.release(m);
  EXPECT_TRUE(copies.empty());
}

TEST_F(KvCacheTest, ForkSharesThenCopiesOnWriteThroughTheStepCopyList) {
  auto s = storage(1, 2, 4);
  BlockManager m(*s);
  std::vector<BlockCopy> copies;
  SequenceKv a;
  a.prepare_append(m, 6, &copies);
  for (int pos = 0; pos < 6; ++pos)
    static_cast<float*>(s->key_block(0, a.blocks()[pos / 4]))[(pos % 4) * 2] =
        static_cast<float>(pos);
  // The slot position 6 will take in a's block: storage is not zeroed, so mark it.
  static_cast<float*>(s->key_block(0, a.blocks()[1]))[2 * 2] = -1.0f;
  a.commit(6);
  SequenceKv b = a.fork(m);
  EXPECT_EQ(b.blocks(), a.blocks());
  EXPECT_EQ(m.refcount(a.blocks()[1]), 2);
  EXPECT_EQ(b.blocks_needed(m, 1), 1) << "appending into a shared block needs a copy";
  // b appends into the shared, partly filled block 1: it gets a fresh block, and the copy is
  // recorded for the backend to make before the step runs.
  b.prepare_append(m, 1, &copies);
  ASSERT_EQ(copies.size(), 1u);
  EXPECT_EQ(copies[0].src, a.blocks()[1]);
  EXPECT_EQ(copies[0].dst, b.blocks()[1]);
  EXPECT_EQ(b.blocks()[0], a.blocks()[0]) << "full blocks stay shared";
  s->copy_blocks(copies);
  static_cast<float*>(s->key_block(0, b.blocks()[1]))[2 * 2] = 99.0f;  // position 6
  b.commit(1);
  EXPECT_EQ(static_cast<float*>(s->key_block(0, b.blocks()[1]))[0], 4.0f)
      << "the copy carries the prefix";
  EXPECT_EQ(static_cast<float*>(s->key_block(0, a.blocks()[1]))[2 * 2], -1.0f)
      << "a's block is not written";
  a.release(m);
  b.release(m);
  EXPECT_EQ(m.in_use(), 0);
}

TEST_F(KvCacheTest, BudgetLimitsAllocation) {
  auto s = storage(1, 4, 4);
  BlockManager m(*s, 3);
  std::vector<BlockCopy> copies;
  SequenceKv a;
  EXPECT_EQ(a.blocks_needed(m, 12), 3);
  a.prepare_append(m, 12, &copies);
  EXPECT_EQ(m.available(), 0);
  SequenceKv b;
  EXPECT_THROW(b.prepare_append(m, 1, &copies), Error);
  a.release(m);
  EXPECT_EQ(m.available(), 3);
}

TEST_F(KvCacheTest, ShrinksToTheHighestBlockInUse) {
  auto s = storage(1, 4, 4);
  BlockManager m(*s);
  std::vector<BlockCopy> copies;
  std::vector<SequenceKv> seqs(3);
  for (SequenceKv& q : seqs) q.prepare_append(m, 4 * 64, &copies);  // three chunks of 64 blocks
  const int64_t full = m.capacity();
  EXPECT_GE(full, 192);
  seqs[2].release(m);
  seqs[1].release(m);
  EXPECT_LT(m.shrink(), full) << "the top chunks were free";
  EXPECT_GE(m.capacity(), 64);
  EXPECT_EQ(m.in_use(), 64);
  // Blocks of the kept sequence are still usable, and new ones come from the freed range.
  SequenceKv again;
  again.prepare_append(m, 4, &copies);
  EXPECT_LT(again.blocks()[0], m.capacity());
  seqs[0].release(m);
  again.release(m);
  EXPECT_EQ(m.shrink(), 0);
  // The CPU storage keeps released chunks for the next request (a fresh one costs its page
  // faults again): never more than the high-water mark, and growing again allocates nothing.
  const int64_t kept = s->bytes_allocated();
  EXPECT_LE(kept, full * s->geometry().block_bytes());
  SequenceKv next;
  next.prepare_append(m, 4 * 64, &copies);
  EXPECT_EQ(s->bytes_allocated(), kept);
  next.release(m);
}

TEST_F(KvCacheTest, BadInputGeometry) {
  EXPECT_THROW(storage(0, 8, 4), Error);
  EXPECT_THROW(storage(2, 0, 4), Error);
  auto s = storage(1, 4, 4);
  EXPECT_THROW(s->key_block(0, 7), Error);
  EXPECT_THROW(BlockManager(*s, -1), Error);
}

}  // namespace
}  // namespace kiln
