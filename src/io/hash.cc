#include "io/hash.h"

#include <algorithm>
#include <cstring>

#include <fmt/format.h>

#include "core/tensor.h"

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

inline void absorb(uint64_t lane[4], const unsigned char* p) {
  for (int k = 0; k < 4; ++k) {
    uint64_t w;
    std::memcpy(&w, p + 8 * k, 8);
    lane[k] = (lane[k] ^ w) * 0x100000001b3ull;
    lane[k] ^= lane[k] >> 29;
  }
}

}  // namespace

// Four independent lanes keep the multiplies in flight (several GB/s), then fold.
Hash64::Hash64(uint64_t seed)
    : lane_{seed ^ 0x9e3779b97f4a7c15ull, seed + 0x632be59bd9b4e019ull,
            seed ^ 0x85ebca77c2b2ae63ull, seed - 0x27d4eb2f165667c5ull} {}

void Hash64::update(const void* data, size_t bytes) {
  const auto* p = static_cast<const unsigned char*>(data);
  total_ += bytes;
  if (pending_bytes_ > 0) {
    const size_t take = std::min(bytes, 32 - pending_bytes_);
    std::memcpy(pending_ + pending_bytes_, p, take);
    pending_bytes_ += take;
    p += take;
    bytes -= take;
    if (pending_bytes_ < 32) return;
    absorb(lane_, pending_);
    pending_bytes_ = 0;
  }
  for (; bytes >= 32; p += 32, bytes -= 32) absorb(lane_, p);
  std::memcpy(pending_, p, bytes);
  pending_bytes_ = bytes;
}

uint64_t Hash64::digest() const {
  uint64_t h = mix(lane_[0]) ^ (mix(lane_[1]) * 3) ^ (mix(lane_[2]) * 5) ^ (mix(lane_[3]) * 7);
  for (size_t i = 0; i < pending_bytes_; ++i) h = (h ^ pending_[i]) * 0x100000001b3ull;
  return mix(h ^ total_);
}

uint64_t hash64(const void* data, size_t bytes, uint64_t seed) {
  Hash64 h(seed);
  h.update(data, bytes);
  return h.digest();
}

uint64_t hash64_releasing(const void* data, size_t bytes) {
  constexpr size_t kPiece = size_t{64} << 20;
  const auto* p = static_cast<const char*>(data);
  Hash64 h;
  for (size_t done = 0; done < bytes; done += kPiece) {
    const size_t n = std::min(kPiece, bytes - done);
    h.update(p + done, n);
    release_file_pages(p + done, n);
  }
  return h.digest();
}

std::string hash_hex(uint64_t h) { return fmt::format("{:016x}", h); }

}  // namespace kiln
