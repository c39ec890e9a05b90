// A fixed pool of worker threads owned by a Context. parallel_for splits [0, n) into contiguous
// chunks, one per worker, and runs them with the calling thread taking part.
//
// A decode step runs a few hundred short parallel_for calls (tens of microseconds each), so
// handing out a job must cost far less than a futex wake-up: idle workers spin on the job counter
// for a while (kSpin) before they sleep, and the caller spins for the others to finish. A worker
// that has slept is woken through the futex as before.
#pragma once

#include <atomic>
#include <cstdint>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kiln {

class ThreadPool {
 public:
  // threads <= 0 means one per hardware thread.
  explicit ThreadPool(int threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return static_cast<int>(workers_.size()) + 1; }
  // Calls fn(begin, end) on disjoint ranges covering [0, n). Ranges are at least `grain` long.
  // Calls from several threads are serialized; a call from inside fn runs inline.
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop(int index);
  void run_chunk(int index);

  std::vector<std::thread> workers_;
  std::mutex submit_;  // one job at a time
  // The job, written before generation_ is bumped (release) and read after (acquire).
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int job_chunks_ = 0;
  std::atomic<uint32_t> generation_{0};
  std::atomic<int> sleepers_{0};  // workers blocked in generation_.wait
  std::atomic<int> pending_{0};   // workers that have not finished the current job
  std::atomic<bool> caller_asleep_{false};
  std::atomic<bool> stop_{false};
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

}  // namespace kiln
