// A fixed pool of worker threads owned by a Context. parallel_for splits [0, n) into contiguous
// chunks, one per worker, and runs them with the calling thread taking part.
#pragma once

#include <condition_variable>
#include <cstdint>
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
  void parallel_for(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker_loop(int index);

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::condition_variable finished_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int job_chunks_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
  std::exception_ptr error_;
};

}  // namespace kiln
