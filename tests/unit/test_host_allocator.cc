// The host allocator: zero-filled, aligned memory; buffers of 16 MiB or more (a workspace sized
// for a plan's largest step) resident only where they are written.
#include <gtest/gtest.h>

#include <cstdint>
#include <fstream>
#include <set>
#include <string>

#include "backend/backend.h"

namespace kiln {
namespace {

// This process's resident memory (VmRSS), or -1 where /proc/self/status has none.
[[maybe_unused]] int64_t resident_bytes() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmRSS:", 0) == 0) return std::stoll(line.substr(6)) * 1024;
  return -1;
}

TEST(HostAllocator, BuffersAreZeroedAlignedAndWritable) {
  for (size_t bytes : {size_t{1}, size_t{100}, size_t{3} << 20, size_t{40} << 20}) {
    std::shared_ptr<void> p = host_allocator().allocate(bytes);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p.get()) % 64, 0u) << bytes;
    auto* b = static_cast<unsigned char*>(p.get());
    for (size_t at : std::set<size_t>{0, bytes / 2, bytes - 1}) {
      EXPECT_EQ(b[at], 0) << bytes << " at " << at;
      b[at] = 0xAB;
      EXPECT_EQ(b[at], 0xAB);
    }
  }
}

TEST(HostAllocator, LargeBuffersAreResidentOnlyWhereWritten) {
#if defined(__SANITIZE_ADDRESS__)
  GTEST_SKIP() << "under AddressSanitizer every buffer comes from the heap, zeroed up front";
#else
  const int64_t before = resident_bytes();
  if (before < 0) GTEST_SKIP() << "no /proc/self/status here";
  constexpr size_t kBytes = size_t{256} << 20;
  std::shared_ptr<void> p = host_allocator().allocate(kBytes);
  auto* b = static_cast<unsigned char*>(p.get());
  b[0] = 1;  // one page (a 2 MB one where huge pages are granted)
  const int64_t after = resident_bytes();
  EXPECT_LT(after - before, int64_t{32} << 20) << "a 256 MiB buffer with one byte written";
  EXPECT_EQ(b[kBytes - 1], 0);
#endif
}

}  // namespace
}  // namespace kiln
