// The deferred checks of a CUDA context's steps: kernels report bad data (a token id outside
// the vocabulary, a block table naming no block) in one device status word; each step ends by
// copying it behind its kernels, and the check of that copy is made when the host next waits
// for the GPU, so that a decode step costs one wait instead of two. The error names the node of
// the step that found it.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels.cuh"
#include "backend/cuda/launch_stream.h"
#include "core/logging.h"
#include "graph/ir.h"

namespace kiln::cuda {

class StepChecks {
 public:
  // `defer`: not KILN_CUDA_DEFER_CHECK=0. `log` takes the errors of a graph that goes away.
  StepChecks(LaunchStream& stream, const Logger& log, bool defer);
  ~StepChecks();
  StepChecks(const StepChecks&) = delete;
  StepChecks& operator=(const StepChecks&) = delete;

  // The word kernels report bad data in.
  DeviceStatus* status() { return status_; }
  // Ends a step of `graph`: the status word is copied to pinned host memory behind the step's
  // kernels (by a kernel). With `wait` (or without deferring) it waits for the stream and checks
  // it now; otherwise the check is pending and returns at once, so that the host queues what
  // reads the step's results (the argmax, its copy back) while the GPU still runs the step. A
  // pending check is made by the next synchronize() — every read of device results on the host
  // goes through it or through check_through() — or before the next step begins (settle()). Up
  // to kMaxPending checks wait at once (a step queued behind an unread one:
  // StepContext::behind_unread); a third step waits for the oldest.
  void finish_step(const Graph& graph, bool wait);
  // Waits for the stream; then each pending check, oldest first, throws if a kernel reported
  // bad data (naming the node of that step's graph) and clears the status and the later checks
  // (steps after a failed one are not trusted).
  void synchronize();
  // Makes the pending checks (waiting for the stream) before the next step reuses the step
  // buffers; a step queued behind an unread one skips this.
  void settle() {
    if (pending_ > 0) synchronize();
  }
  // The executor of `graph` goes away: a pending check of it is made without throwing (a
  // reported error is logged and cleared, not left to be blamed on another graph).
  void forget_step(const Graph& graph);
  // A step failed on the host after some of its kernels were queued: waits for them and clears
  // whatever they reported (the step's error is the one being thrown).
  void abandon_step();
  // Checks are numbered in the order steps end: the number of the last one so far.
  uint64_t made() const { return checks_made_; }
  // Makes the pending checks numbered up to `number` (their copies have been waited for, e.g.
  // behind an argmax queued after them); later ones stay pending.
  void check_through(uint64_t number) {
    while (pending_ > 0 && checks_[first_check_].number <= number) check_oldest();
  }

 private:
  // Waits for the oldest pending copy and checks it.
  void check_oldest();
  LaunchStream& stream_;
  const Logger& log_;
  bool defer_ = true;
  DeviceStatus* status_ = nullptr;
  // A step's status copied behind it and not checked yet: the graph it ran, the pinned copy,
  // and an event after the copy. A ring of kMaxPending, oldest at first_check_.
  struct PendingCheck {
    uint64_t number = 0;
    const Graph* graph = nullptr;
    DeviceStatus* host = nullptr;
    cudaEvent_t copied = nullptr;
  };
  static constexpr int kMaxPending = 2;
  PendingCheck checks_[kMaxPending];
  DeviceStatus* status_host_ = nullptr;  // pinned: kMaxPending copies
  int first_check_ = 0;
  int pending_ = 0;
  uint64_t checks_made_ = 0;
};

}  // namespace kiln::cuda
