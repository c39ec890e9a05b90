#include "core/bandwidth.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>

#include "core/status.h"

namespace kiln {

namespace {

typedef float V8 __attribute__((vector_size(32)));
typedef float V8Unaligned __attribute__((vector_size(32), aligned(4), may_alias));

// Sums a range with four independent accumulators so the loop is bound by loads, not adds.
float stream_sum(const float* p, size_t n) {
  V8 a = {}, b = {}, c = {}, d = {};
  size_t i = 0;
  for (; i + 32 <= n; i += 32) {
    a += *reinterpret_cast<const V8Unaligned*>(p + i);
    b += *reinterpret_cast<const V8Unaligned*>(p + i + 8);
    c += *reinterpret_cast<const V8Unaligned*>(p + i + 16);
    d += *reinterpret_cast<const V8Unaligned*>(p + i + 24);
  }
  const V8 s = (a + b) + (c + d);
  float r = 0.0f;
  for (int k = 0; k < 8; ++k) r += s[k];
  for (; i < n; ++i) r += p[i];
  return r;
}

}  // namespace

BandwidthResult measure_read_bandwidth(ThreadPool& pool, size_t bytes, int passes) {
  KILN_CHECK(bytes >= 4096 && passes > 0, "bandwidth probe needs a buffer and a pass");
  const size_t n = bytes / sizeof(float);
  std::unique_ptr<float[]> buffer(new float[n]);
  // Touch every page from the pool's threads (first-touch placement) with non-zero data.
  pool.parallel_for(static_cast<int64_t>(n), 1 << 16, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) buffer[i] = static_cast<float>(i & 7);
  });
  BandwidthResult r;
  r.bytes = n * sizeof(float);
  r.passes = passes;
  std::atomic<float> sink{0.0f};
  const int64_t chunks = pool.size() * 8;
  const int64_t per = static_cast<int64_t>(n) / chunks;
  for (int pass = 0; pass < passes; ++pass) {
    const auto t0 = std::chrono::steady_clock::now();
    pool.parallel_for(chunks, 1, [&](int64_t b, int64_t e) {
      float s = 0.0f;
      for (int64_t c = b; c < e; ++c) {
        const int64_t end = c == chunks - 1 ? static_cast<int64_t>(n) : (c + 1) * per;
        s += stream_sum(buffer.get() + c * per, static_cast<size_t>(end - c * per));
      }
      sink.store(sink.load() + s);
    });
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    r.gbps = std::max(r.gbps, static_cast<double>(r.bytes) / secs / 1e9);
  }
  return r;
}

}  // namespace kiln
