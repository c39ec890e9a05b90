#include "backend/pool_allocator.h"

#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#define KILN_POISON(p, n) ASAN_POISON_MEMORY_REGION(p, n)
#define KILN_UNPOISON(p, n) ASAN_UNPOISON_MEMORY_REGION(p, n)
#else
#define KILN_POISON(p, n) ((void)(p), (void)(n))
#define KILN_UNPOISON(p, n) ((void)(p), (void)(n))
#endif

namespace kiln {

namespace {

constexpr size_t kAlign = 64;

size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

struct Chunk {
  std::shared_ptr<void> memory;
  size_t bytes = 0;
  std::map<size_t, size_t> free;  // offset -> length, coalesced
  size_t used = 0;
};

}  // namespace

struct PoolAllocator::State {
  Allocator& base;
  size_t chunk_bytes;
  mutable std::mutex mutex;
  std::vector<std::unique_ptr<Chunk>> chunks;

  State(Allocator& b, size_t c) : base(b), chunk_bytes(c) {}
  ~State() {
    for (auto& c : chunks) KILN_UNPOISON(c->memory.get(), c->bytes);
  }

  // First fit over the chunks in order; a new chunk when none has room.
  std::pair<Chunk*, size_t> take(size_t bytes) {
    for (auto& c : chunks)
      for (auto it = c->free.begin(); it != c->free.end(); ++it)
        if (it->second >= bytes) {
          const size_t at = it->first, left = it->second - bytes;
          c->free.erase(it);
          if (left > 0) c->free.emplace(at + bytes, left);
          c->used += bytes;
          return {c.get(), at};
        }
    auto c = std::make_unique<Chunk>();
    c->bytes = std::max(chunk_bytes, round_up(bytes, size_t{2} << 20));
    c->memory = base.allocate(c->bytes);
    KILN_POISON(c->memory.get(), c->bytes);
    if (c->bytes > bytes) c->free.emplace(bytes, c->bytes - bytes);
    c->used = bytes;
    chunks.push_back(std::move(c));
    return {chunks.back().get(), 0};
  }

  void give_back(Chunk* c, size_t at, size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex);
    KILN_POISON(static_cast<char*>(c->memory.get()) + at, bytes);
    c->used -= bytes;
    auto next = c->free.lower_bound(at);
    if (next != c->free.end() && at + bytes == next->first) {
      bytes += next->second;
      next = c->free.erase(next);
    }
    if (next != c->free.begin()) {
      auto prev = std::prev(next);
      if (prev->first + prev->second == at) {
        prev->second += bytes;
        return;
      }
    }
    c->free.emplace(at, bytes);
  }
};

PoolAllocator::PoolAllocator(Allocator& base, size_t chunk_bytes)
    : state_(std::make_shared<State>(base, chunk_bytes)) {
  KILN_CHECK(base.device() == Device::kCpu, "PoolAllocator: pools host memory, not {}",
             device_name(base.device()));
  KILN_CHECK(chunk_bytes >= kAlign, "PoolAllocator: chunks of {} bytes", chunk_bytes);
}

std::shared_ptr<void> PoolAllocator::allocate(size_t bytes) {
  const size_t need = round_up(std::max<size_t>(bytes, 1), kAlign);
  Chunk* chunk;
  size_t at;
  {
    std::lock_guard<std::mutex> lock(state_->mutex);
    std::tie(chunk, at) = state_->take(need);
  }
  char* p = static_cast<char*>(chunk->memory.get()) + at;
  KILN_UNPOISON(p, need);
  std::memset(p, 0, need);
  // The deleter holds the state: chunks live while any buffer does.
  std::shared_ptr<State> state = state_;
  return std::shared_ptr<void>(
      p, [state, chunk, at, need](void*) { state->give_back(chunk, at, need); });
}

size_t PoolAllocator::shrink() {
  std::lock_guard<std::mutex> lock(state_->mutex);
  size_t freed = 0;
  std::erase_if(state_->chunks, [&](const std::unique_ptr<Chunk>& c) {
    if (c->used != 0) return false;
    freed += c->bytes;
    KILN_UNPOISON(c->memory.get(), c->bytes);
    return true;
  });
  return freed;
}

size_t PoolAllocator::chunk_bytes() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  size_t n = 0;
  for (const auto& c : state_->chunks) n += c->bytes;
  return n;
}

size_t PoolAllocator::used_bytes() const {
  std::lock_guard<std::mutex> lock(state_->mutex);
  size_t n = 0;
  for (const auto& c : state_->chunks) n += c->used;
  return n;
}

}  // namespace kiln
