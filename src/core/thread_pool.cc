#include "core/thread_pool.h"

#include <immintrin.h>

#include <algorithm>
#include <chrono>

namespace kiln {

namespace {

// How long an idle thread spins before it sleeps: longer than the gaps inside a decode step
// (norms, sampling), short enough that an idle engine gives its cores back at once.
constexpr std::chrono::microseconds kSpin{1000};

// True on a thread running a chunk of some pool's job (a nested parallel_for runs inline).
thread_local bool tls_in_job = false;

void chunk_range(int64_t n, int chunks, int index, int64_t* begin, int64_t* end) {
  const int64_t base = n / chunks, extra = n % chunks;
  *begin = index * base + std::min<int64_t>(index, extra);
  *end = *begin + base + (index < extra ? 1 : 0);
}

// Spins until done() or kSpin has passed; returns done().
template <class Done>
bool spin_until(Done&& done) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (int i = 1;; ++i) {
    if (done()) return true;
    _mm_pause();
    if (i % 64 == 0 && std::chrono::steady_clock::now() > deadline) return done();
  }
}

}  // namespace

ThreadPool::ThreadPool(int threads) {
  if (threads <= 0) threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true);
  generation_.fetch_add(1);
  generation_.notify_all();
  for (auto& w : workers_) w.join();
}

void ThreadPool::run_chunk(int index) {
  int64_t b, e;
  chunk_range(job_n_, job_chunks_, index, &b, &e);
  tls_in_job = true;
  try {
    (*job_)(b, e);
  } catch (...) {
    std::lock_guard<std::mutex> lock(error_mutex_);
    if (!error_) error_ = std::current_exception();
  }
  tls_in_job = false;
}

void ThreadPool::parallel_for(int64_t n, int64_t grain,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int chunks = static_cast<int>(std::clamp<int64_t>(n / grain, 1, size()));
  if (chunks <= 1 || tls_in_job) {
    fn(0, n);
    return;
  }
  std::lock_guard<std::mutex> submit(submit_);
  job_ = &fn;
  job_n_ = n;
  job_chunks_ = chunks;
  error_ = nullptr;
  // Every worker acknowledges every job (those past `chunks` at once), so none can still be
  // reading this job's fields when the next one is written.
  pending_.store(size() - 1, std::memory_order_relaxed);
  // seq_cst: either a worker about to sleep sees the new generation, or we see it asleep.
  generation_.fetch_add(1);
  if (sleepers_.load() > 0) generation_.notify_all();
  run_chunk(0);
  if (!spin_until([this] { return pending_.load(std::memory_order_acquire) == 0; })) {
    caller_asleep_.store(true);
    for (int p; (p = pending_.load()) != 0;) pending_.wait(p);
    caller_asleep_.store(false);
  }
  job_ = nullptr;
  std::exception_ptr error;
  std::swap(error, error_);
  if (error) std::rethrow_exception(error);
}

void ThreadPool::worker_loop(int index) {
  uint32_t seen = 0;
  for (;;) {
    const auto fresh = [&] { return generation_.load(std::memory_order_acquire) != seen; };
    while (!spin_until(fresh)) {
      sleepers_.fetch_add(1);
      generation_.wait(seen);  // returns at once if the generation moved meanwhile
      sleepers_.fetch_sub(1);
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load()) return;
    if (index < job_chunks_) run_chunk(index);
    if (pending_.fetch_sub(1) == 1 && caller_asleep_.load()) pending_.notify_all();
  }
}

}  // namespace kiln
