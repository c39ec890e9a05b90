// A fast 64-bit content hash for plan checksums and weight deduplication (not cryptographic:
// it detects corruption and edits, it does not resist forgery).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace kiln {

uint64_t hash64(const void* data, size_t bytes, uint64_t seed = 0);
std::string hash_hex(uint64_t h);  // 16 lowercase hex digits

}  // namespace kiln
