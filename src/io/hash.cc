#include "io/hash.h"

#include <cstring>

#include <fmt/format.h>

namespace kiln {

namespace {

inline uint64_t mix(uint64_t h) {
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return h;
}

}  // namespace

uint64_t hash64(const void* data, size_t bytes, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  // Four independent lanes keep the multiplies in flight (several GB/s), then fold.
  uint64_t lane[4] = {seed ^ 0x9e3779b97f4a7c15ull, seed + 0x632be59bd9b4e019ull,
                      seed ^ 0x85ebca77c2b2ae63ull, seed - 0x27d4eb2f165667c5ull};
  size_t i = 0;
  for (; i + 32 <= bytes; i += 32)
    for (int k = 0; k < 4; ++k) {
      uint64_t w;
      std::memcpy(&w, p + i + 8 * k, 8);
      lane[k] = (lane[k] ^ w) * 0x100000001b3ull;
      lane[k] ^= lane[k] >> 29;
    }
  uint64_t h = mix(lane[0]) ^ (mix(lane[1]) * 3) ^ (mix(lane[2]) * 5) ^ (mix(lane[3]) * 7);
  for (; i < bytes; ++i) h = (h ^ p[i]) * 0x100000001b3ull;
  return mix(h ^ bytes);
}

std::string hash_hex(uint64_t h) { return fmt::format("{:016x}", h); }

}  // namespace kiln
