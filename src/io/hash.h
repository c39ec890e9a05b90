// A fast 64-bit content hash for plan checksums and weight deduplication (not cryptographic:
// it detects corruption and edits, it does not resist forgery).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kiln {

uint64_t hash64(const void* data, size_t bytes, uint64_t seed = 0);
// hash64 of bytes given in pieces (the same value as one call over their concatenation).
class Hash64 {
 public:
  explicit Hash64(uint64_t seed = 0);
  void update(const void* data, size_t bytes);
  uint64_t digest() const;

 private:
  uint64_t lane_[4];
  unsigned char pending_[32];
  size_t pending_bytes_ = 0;
  size_t total_ = 0;
};
// hash64 of a read-only file mapping's bytes, read in pieces whose pages are released
// (release_file_pages) as it goes: hashing a checkpoint does not make it resident.
uint64_t hash64_releasing(const void* data, size_t bytes);
std::string hash_hex(uint64_t h);  // 16 lowercase hex digits

}  // namespace kiln
