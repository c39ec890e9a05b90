// A fixed pool of worker threads owned by a Context. parallel_for splits [0, n) into contiguous
// chunks, at most one per thread, and runs them with the calling thread taking part. Chunks are
// claimed, not assigned: the caller runs whatever no worker has taken, so a worker that the OS
// has not scheduled (another process on its core) costs the job its share of the work, never a
// wait for that worker to wake. The chunks' bounds depend only on n, grain and the pool's size.
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
  void worker_loop();
  void run_chunk(int index);
  void run_claimed_chunks();

  std::vector<std::thread> workers_;
  std::mutex submit_;  // one job at a time
  // The job, written before generation_ is bumped (release) and read after (acquire).
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t job_n_ = 0;
  int job_chunks_ = 0;
  uint64_t job_id_ = 0;             // the caller's count of jobs
  std::atomic<int> next_chunk_{0};  // the next chunk to claim
  // The current job: its id << 33 | open << 32 | workers inside it. Workers enter only while it
  // is open; the caller closes it when every chunk is claimed and waits for those inside.
  std::atomic<uint64_t> state_{0};
  std::atomic<uint32_t> generation_{0};  // bumped per job: wakes the workers
  std::atomic<int> sleepers_{0};         // workers blocked in generation_.wait
  std::atomic<bool> caller_asleep_{false};
  std::atomic<bool> stop_{false};
  std::mutex error_mutex_;
  std::exception_ptr error_;
};

}  // namespace kiln
