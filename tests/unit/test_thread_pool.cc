// The thread pool's contract: disjoint ranges covering [0, n) at least `grain` long, errors
// rethrown on the caller, nested and concurrent calls, and workers that wake up after sleeping.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/thread_pool.h"

namespace kiln {
namespace {

// Each index of [0, n) is visited exactly once; returns the ranges handed out.
std::vector<std::pair<int64_t, int64_t>> cover(ThreadPool& pool, int64_t n, int64_t grain) {
  std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
  std::mutex m;
  std::vector<std::pair<int64_t, int64_t>> ranges;
  pool.parallel_for(n, grain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) hits[i].fetch_add(1);
    std::lock_guard<std::mutex> lock(m);
    ranges.emplace_back(b, e);
  });
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[i].load(), 1) << "index " << i << " of " << n;
  return ranges;
}

TEST(ThreadPool, RangesCoverEveryIndexOnceAndRespectTheGrain) {
  for (int threads : {1, 2, 3, 5}) {
    ThreadPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int64_t n : {1, 2, 7, 64, 1000}) {
      for (int64_t grain : {1, 8, 300}) {
        const auto ranges = cover(pool, n, grain);
        EXPECT_LE(static_cast<int>(ranges.size()), threads);
        if (ranges.size() > 1) {
          for (const auto& [b, e] : ranges) EXPECT_GE(e - b, std::min(grain, n)) << n;
        }
      }
    }
  }
}

TEST(ThreadPool, ManyShortJobsInARow) {
  ThreadPool pool(2);
  std::atomic<int64_t> sum{0};
  for (int job = 0; job < 20000; ++job)
    pool.parallel_for(2, 1, [&](int64_t b, int64_t e) { sum.fetch_add(e - b); });
  EXPECT_EQ(sum.load(), 40000);
}

TEST(ThreadPool, WorkersWakeUpAfterSleeping) {
  ThreadPool pool(3);
  for (int round = 0; round < 3; ++round) {
    // Longer than the workers spin, so they are asleep when the next job comes.
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    std::atomic<int> chunks{0};
    std::set<std::thread::id> ids;
    std::mutex m;
    pool.parallel_for(3, 1, [&](int64_t, int64_t) {
      // Longer than a wake-up: the caller cannot claim every chunk before the workers come.
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      chunks.fetch_add(1);
      std::lock_guard<std::mutex> lock(m);
      ids.insert(std::this_thread::get_id());
    });
    EXPECT_EQ(chunks.load(), 3);
    EXPECT_EQ(ids.size(), 3u) << "every worker took its chunk";
  }
}

TEST(ThreadPool, CallerWaitsForASlowWorker) {
  ThreadPool pool(2);
  std::atomic<bool> slow_done{false};
  pool.parallel_for(2, 1, [&](int64_t b, int64_t) {
    if (b == 1) {  // the worker's chunk outlasts the caller's spin
      std::this_thread::sleep_for(std::chrono::milliseconds(30));
      slow_done.store(true);
    }
  });
  EXPECT_TRUE(slow_done.load());
}

TEST(ThreadPool, AnErrorInAnyChunkReachesTheCaller) {
  ThreadPool pool(2);
  for (int64_t failing : {0, 1}) {
    EXPECT_THROW(pool.parallel_for(2, 1,
                                   [&](int64_t b, int64_t) {
                                     if (b == failing) throw std::runtime_error("chunk failed");
                                   }),
                 std::runtime_error);
    // The pool stays usable.
    cover(pool, 100, 1);
  }
}

TEST(ThreadPool, NestedCallsRunInline) {
  ThreadPool pool(2);
  std::atomic<int64_t> inner{0};
  pool.parallel_for(2, 1, [&](int64_t, int64_t) {
    pool.parallel_for(10, 1, [&](int64_t b, int64_t e) { inner.fetch_add(e - b); });
  });
  EXPECT_EQ(inner.load(), 20);
}

TEST(ThreadPool, CallsFromSeveralThreadsAreSerialized) {
  ThreadPool pool(2);
  std::atomic<int64_t> total{0};
  std::vector<std::thread> callers;
  for (int c = 0; c < 3; ++c)
    callers.emplace_back([&] {
      for (int job = 0; job < 2000; ++job)
        pool.parallel_for(4, 1, [&](int64_t b, int64_t e) { total.fetch_add(e - b); });
    });
  for (auto& t : callers) t.join();
  EXPECT_EQ(total.load(), 3 * 2000 * 4);
}

}  // namespace
}  // namespace kiln
