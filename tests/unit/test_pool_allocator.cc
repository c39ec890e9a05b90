// The pool of host chunks that T5 requests' cross K/V come from: buffers of their exact size
// (64-byte aligned), zero-filled, reused first fit with freed neighbours joined, chunks kept
// until shrink() and alive while any buffer is; under AddressSanitizer what is not handed out is
// poisoned.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>

#include "backend/pool_allocator.h"

namespace kiln {
namespace {

constexpr size_t kMiB = size_t{1} << 20;

char* at(const std::shared_ptr<void>& p) { return static_cast<char*>(p.get()); }

TEST(PoolAllocator, ExactSizesFromOneChunkReusedFirstFitAndZeroed) {
  PoolAllocator pool(host_allocator(), 4 * kMiB);
  std::shared_ptr<void> a = pool.allocate(1000), b = pool.allocate(5000), c = pool.allocate(64);
  EXPECT_EQ(pool.chunk_bytes(), 4 * kMiB) << "one chunk";
  EXPECT_EQ(pool.used_bytes(), 1024u + 5056u + 64u) << "each rounded up to 64 bytes only";
  EXPECT_EQ(at(b) - at(a), 1024) << "packed back to back";
  EXPECT_EQ(at(c) - at(b), 5056);
  for (const auto& p : {a, b, c}) EXPECT_EQ(reinterpret_cast<uintptr_t>(p.get()) % 64, 0u);
  std::memset(a.get(), 0x5A, 1000);
  std::memset(b.get(), 0x5A, 5000);
  char* const a_at = at(a);
  a.reset();
  b.reset();
  EXPECT_EQ(pool.used_bytes(), 64u);
  // The two freed neighbours are one range again: a buffer as large as both fits where a was.
  std::shared_ptr<void> d = pool.allocate(1024 + 5056);
  EXPECT_EQ(at(d), a_at);
  for (size_t i = 0; i < 1024 + 5056; ++i) ASSERT_EQ(at(d)[i], 0) << "zeroed at " << i;
  EXPECT_EQ(pool.chunk_bytes(), 4 * kMiB) << "no new chunk";
}

TEST(PoolAllocator, LargeBuffersGetChunksOfTheirOwnAndShrinkGivesBackOnlyFreeChunks) {
  PoolAllocator pool(host_allocator(), 4 * kMiB);
  std::shared_ptr<void> small = pool.allocate(3 * kMiB);
  std::shared_ptr<void> large = pool.allocate(9 * kMiB);   // more than a chunk: 10 MiB of its own
  std::shared_ptr<void> second = pool.allocate(2 * kMiB);  // the first chunk has 1 MiB left
  EXPECT_EQ(pool.chunk_bytes(), 4 * kMiB + 10 * kMiB + 4 * kMiB);
  at(large)[9 * kMiB - 1] = 1;
  large.reset();
  EXPECT_EQ(pool.shrink(), 10 * kMiB) << "only the chunk no buffer uses";
  EXPECT_EQ(pool.chunk_bytes(), 8 * kMiB);
  small.reset();
  second.reset();
  EXPECT_EQ(pool.used_bytes(), 0u);
  EXPECT_EQ(pool.chunk_bytes(), 8 * kMiB) << "kept for the next buffers until shrink()";
  EXPECT_EQ(pool.shrink(), 8 * kMiB);
  EXPECT_EQ(pool.chunk_bytes(), 0u);
}

TEST(PoolAllocator, BuffersOutliveThePool) {
  std::shared_ptr<void> kept;
  {
    PoolAllocator pool(host_allocator(), kMiB);
    kept = pool.allocate(4096);
  }
  std::memset(kept.get(), 7, 4096);  // still mapped: the buffer holds its chunk
  EXPECT_EQ(at(kept)[4095], 7);
  kept.reset();
}

TEST(PoolAllocator, BadInputNonHostBaseIsRefused) {
  class DeviceLike final : public Allocator {
   public:
    Device device() const override { return Device::kCuda; }
    std::shared_ptr<void> allocate(size_t) override { return nullptr; }
    Tensor upload(const Tensor& host) override { return host; }
  } device;
  try {
    PoolAllocator pool(device);
    ADD_FAILURE() << "a pool over device memory was made";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pools host memory"), std::string::npos) << e.what();
  }
}

#if defined(__SANITIZE_ADDRESS__)
// Under AddressSanitizer a freed pool buffer, and the chunk's room no buffer holds, are poisoned:
// a kernel reading a finished request's cross K/V is reported, as it would be on the heap.
TEST(PoolAllocatorDeathTest, BadInputUseOfAFreedBufferIsReported) {
  PoolAllocator pool(host_allocator(), kMiB);
  std::shared_ptr<void> p = pool.allocate(256);
  volatile char* raw = at(p);
  p.reset();
  EXPECT_DEATH(static_cast<void>(raw[0]), "use-after-poison");
  std::shared_ptr<void> q = pool.allocate(128);
  volatile char* past = at(q) + 128;  // past its end, in the chunk's free room
  EXPECT_DEATH(static_cast<void>(past[0]), "use-after-poison");
}
#endif

}  // namespace
}  // namespace kiln
