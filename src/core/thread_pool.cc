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

constexpr uint64_t kOpen = uint64_t{1} << 32;
constexpr uint64_t kInside = kOpen - 1;  // the low 32 bits: workers inside the job

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
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this] { worker_loop(); });
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

void ThreadPool::run_claimed_chunks() {
  for (int c; (c = next_chunk_.fetch_add(1, std::memory_order_relaxed)) < job_chunks_;)
    run_chunk(c);
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
  next_chunk_.store(0, std::memory_order_relaxed);
  // release: a worker that enters the job (acquire) sees its fields.
  state_.store((++job_id_ << 33) | kOpen, std::memory_order_release);
  // seq_cst: either a worker about to sleep sees the new generation, or we see it asleep.
  generation_.fetch_add(1);
  if (sleepers_.load() > 0) generation_.notify_all();
  run_claimed_chunks();
  // Every chunk is claimed: close the job, then wait for the workers still inside (running
  // chunks they claimed). None enters a closed job, so none can read the next job's fields.
  const auto inside = [this] { return (state_.load(std::memory_order_acquire) & kInside) == 0; };
  state_.fetch_and(~kOpen);
  if (!spin_until(inside)) {
    caller_asleep_.store(true);
    for (uint64_t s; ((s = state_.load()) & kInside) != 0;) state_.wait(s);
    caller_asleep_.store(false);
  }
  job_ = nullptr;
  std::exception_ptr error;
  std::swap(error, error_);
  if (error) std::rethrow_exception(error);
}

void ThreadPool::worker_loop() {
  uint32_t seen = 0;
  uint64_t entered = 0;  // the id of the last job this worker entered
  for (;;) {
    const auto fresh = [&] { return generation_.load(std::memory_order_acquire) != seen; };
    while (!spin_until(fresh)) {
      sleepers_.fetch_add(1);
      generation_.wait(seen);  // returns at once if the generation moved meanwhile
      sleepers_.fetch_sub(1);
    }
    seen = generation_.load(std::memory_order_acquire);
    if (stop_.load()) return;
    // Enter the job if it is still open (the caller may have run every chunk already).
    uint64_t s = state_.load(std::memory_order_acquire);
    bool in = false;
    while ((s & kOpen) != 0 && (s >> 33) != entered && !in)
      in = state_.compare_exchange_weak(s, s + 1, std::memory_order_acquire);
    if (!in) continue;
    entered = s >> 33;
    run_claimed_chunks();
    const uint64_t before = state_.fetch_sub(1);
    if ((before & kInside) == 1 && caller_asleep_.load()) state_.notify_all();
  }
}

}  // namespace kiln
