#include <gtest/gtest.h>

#include "runtime/kv_cache.h"

namespace kiln {
namespace {

TEST(PagedKvCache, GrowsByChunksAndReusesFreedBlocks) {
  PagedKvCache cache(2, 8, 4, 2);
  EXPECT_EQ(cache.bytes_allocated(), 0) << "nothing is reserved up front";
  SequenceKv a;
  a.prepare_append(cache, 9);  // 9 positions → 3 blocks of 4
  a.commit(9);
  EXPECT_EQ(a.blocks().size(), 3u);
  EXPECT_EQ(cache.blocks_in_use(), 3);
  EXPECT_EQ(cache.blocks_allocated(), 4);  // two chunks of two blocks
  a.release(cache);
  EXPECT_EQ(cache.blocks_in_use(), 0);
  SequenceKv b;
  b.prepare_append(cache, 16);
  EXPECT_EQ(cache.blocks_allocated(), 4) << "freed blocks are reused before growing";
  b.release(cache);
}

TEST(PagedKvCache, ForkSharesThenCopiesOnWrite) {
  PagedKvCache cache(1, 2, 4, 8);
  SequenceKv a;
  a.prepare_append(cache, 6);
  for (int pos = 0; pos < 6; ++pos) {
    float* k = cache.key_block(0, a.blocks()[pos / 4]) + (pos % 4) * 2;
    k[0] = static_cast<float>(pos);
  }
  a.commit(6);
  SequenceKv b = a.fork(cache);
  EXPECT_EQ(b.blocks(), a.blocks());
  EXPECT_EQ(cache.refcount(a.blocks()[1]), 2);
  // b appends into the shared, partly filled block 1: it gets its own copy; a's is untouched.
  b.prepare_append(cache, 1);
  EXPECT_NE(b.blocks()[1], a.blocks()[1]);
  EXPECT_EQ(b.blocks()[0], a.blocks()[0]) << "full blocks stay shared";
  cache.key_block(0, b.blocks()[1])[2 * 2] = 99.0f;  // position 6
  b.commit(1);
  EXPECT_EQ(cache.key_block(0, b.blocks()[1])[0], 4.0f) << "copy carries the prefix";
  EXPECT_EQ(cache.key_block(0, a.blocks()[1])[2 * 2], 0.0f);
  a.release(cache);
  b.release(cache);
  EXPECT_EQ(cache.blocks_in_use(), 0);
}

TEST(PagedKvCache, BadInputGeometry) {
  EXPECT_THROW(PagedKvCache(0, 8), Error);
  EXPECT_THROW(PagedKvCache(2, 0), Error);
  PagedKvCache cache(1, 4, 4, 1);
  EXPECT_THROW(cache.key_block(0, 7), Error);
}

}  // namespace
}  // namespace kiln
