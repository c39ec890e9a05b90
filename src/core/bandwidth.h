// The machine's memory read bandwidth, measured by kiln itself: every thread of the pool streams
// its share of a buffer far larger than the caches. This is the roofline that decode at small
// batch (which reads every weight once per step) is judged against.
#pragma once

#include <cstddef>

#include "core/thread_pool.h"

namespace kiln {

struct BandwidthResult {
  double gbps = 0.0;  // best of the passes, 1e9 bytes per second
  size_t bytes = 0;   // buffer size read per pass
  int passes = 0;
};

// Reads a `bytes` buffer (default 1 GiB) `passes` times with all of the pool's threads.
BandwidthResult measure_read_bandwidth(ThreadPool& pool, size_t bytes = size_t{1} << 30,
                                       int passes = 5);

}  // namespace kiln
