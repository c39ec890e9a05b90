// The stream a CUDA context runs every kernel and copy on, with its launch policy: whether
// kiln's kernels use programmatic dependent launch, the note of a library launch before the next
// kiln kernel, and the count of launches that tells a kernel whether it may read the step's
// layout before its programmatic-launch wait.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "backend/cuda/kernels.cuh"

namespace kiln::cuda {

class LaunchStream {
 public:
  // A new non-blocking stream on the current device; `programmatic`: kiln's kernels are launched
  // with programmatic dependent launch (sm_90+, not KILN_CUDA_PDL=0).
  explicit LaunchStream(bool programmatic);
  ~LaunchStream();
  LaunchStream(const LaunchStream&) = delete;
  LaunchStream& operator=(const LaunchStream&) = delete;

  cudaStream_t stream() const { return stream_; }
  bool programmatic() const { return programmatic_; }
  // The stream with this policy, for kiln's kernel launchers (kernels.cuh).
  KernelStream kernel_stream() {
    return KernelStream(stream_, programmatic_, &after_library_, &launches_);
  }
  // A cuBLASLt kernel was just enqueued: the next kiln kernel is launched plainly.
  void note_library_launch() {
    after_library_ = true;
    ++launches_;
  }
  // The step's uploads (StepUploads::launch_uploads) were just enqueued.
  void note_uploads() { launches_at_uploads_ = launches_; }
  // Whether a kernel launched now may read the step's layout (uploaded by the uploads kernel)
  // before its programmatic-launch wait: some launch came between. Every kiln kernel triggers
  // its dependents only after its own wait, so a kernel that starts early behind another one
  // starts after the uploads kernel has finished (and, with it, every step before); one
  // launched right behind the uploads kernel may start while it still writes. (A cuBLASLt
  // launch counts: the kiln kernel after it starts only when it has finished.)
  bool layout_visible() const { return launches_ > launches_at_uploads_; }
  // The launch count and the state after the last library launch, saved before a graph capture
  // and restored when the capture fails (its launches never ran: CudaExecutor::run_graph).
  struct LaunchCount {
    int64_t launches = 0;
    bool after_library = false;
  };
  LaunchCount launch_count() const { return {launches_, after_library_}; }
  void restore_launch_count(LaunchCount c) {
    launches_ = c.launches;
    after_library_ = c.after_library;
  }

 private:
  cudaStream_t stream_ = nullptr;
  bool programmatic_ = false;
  bool after_library_ = false;       // note_library_launch(), until the next kiln launch
  int64_t launches_ = 0;             // kernels launched on the stream (kiln's and cuBLASLt's)
  int64_t launches_at_uploads_ = 0;  // launches_ at the last note_uploads()
};

}  // namespace kiln::cuda
