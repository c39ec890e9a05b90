#include "core/thread_pool.h"

#include <algorithm>

namespace kiln {

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& w : workers_) w.join();
}

namespace {
void chunk_range(int64_t n, int chunks, int index, int64_t* begin, int64_t* end) {
  const int64_t base = n / chunks, extra = n % chunks;
  *begin = index * base + std::min<int64_t>(index, extra);
  *end = *begin + base + (index < extra ? 1 : 0);
}
}  // namespace

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int chunks = static_cast<int>(std::min<int64_t>(size(), (n + grain - 1) / grain));
  if (chunks <= 1) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    job_ = &fn;
    job_n_ = n;
    job_chunks_ = chunks;
    pending_ = chunks - 1;
    error_ = nullptr;
    ++generation_;
  }
  wake_.notify_all();
  int64_t b, e;
  chunk_range(n, chunks, 0, &b, &e);
  std::exception_ptr mine;
  try {
    fn(b, e);
  } catch (...) {
    mine = std::current_exception();
  }
  std::unique_lock<std::mutex> lock(mutex_);
  finished_.wait(lock, [this] { return pending_ == 0; });
  job_ = nullptr;
  if (mine) std::rethrow_exception(mine);
  if (error_) std::rethrow_exception(error_);
}

void ThreadPool::worker_loop(int index) {
  uint64_t seen = 0;
  for (;;) {
    const std::function<void(int64_t, int64_t)>* job;
    int64_t n;
    int chunks;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      job = job_;
      n = job_n_;
      chunks = job_chunks_;
    }
    if (job != nullptr && index < chunks) {
      int64_t b, e;
      chunk_range(n, chunks, index, &b, &e);
      try {
        (*job)(b, e);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mutex_);
        if (!error_) error_ = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(mutex_);
      if (--pending_ == 0) finished_.notify_all();
    }
  }
}

}  // namespace kiln
