// What a CUDA context uploads per step: the step's layout (sequence bounds, past lengths, the
// block table, cross K/V addresses), packed into pinned memory (two halves used in turn, so
// that a step is packed while the copy of the one before is queued) and copied with the step's
// host inputs in one kernel, into a device buffer that grows only when a step needs more room
// than any before (a CUDA graph captured for a step keeps its addresses). Also what the
// attention kernels derive from the layout (the longest context's class and bucket) and the
// split attention's partial results.
#pragma once

#include <cuda_runtime.h>

#include <memory>

#include "backend/cuda/cuda_allocator.h"
#include "backend/cuda/launch_stream.h"
#include "backend/step.h"

namespace kiln::cuda {

class StepUploads {
 public:
  // `splits`: decode attention may split along the keys (not KILN_CUDA_SPLIT=0).
  StepUploads(LaunchStream& stream, CudaAllocator& allocator, bool splits);
  ~StepUploads();
  StepUploads(const StepUploads&) = delete;
  StepUploads& operator=(const StepUploads&) = delete;

  // Packs the step's layout into pinned memory, adds its upload to `list` and makes it the
  // current one kernels read; launch_uploads (which must follow, before the step's kernels)
  // enqueues it.
  void upload_step(const StepLayout& layout, UploadList& list);
  // Enqueues the uploads of `list` (one kernel, or copies past UploadList::kMaxBytes) and
  // empties it; the layout's pinned half is reusable once they have run.
  void launch_uploads(UploadList& list);
  // The device buffer the current step's layout is in (its address changes only when a step
  // needs more room than any before).
  const void* step_buffer() const { return device_; }
  const DeviceStep& step() const { return step_; }
  // attention_key_class of the current step's longest key count (split-sequence decode; 0
  // when splits are off).
  int step_key_class() const { return key_class_; }
  // attention_key_bucket of the current step's longest key count (the warp kernel's block
  // size follows it at batch 1).
  int step_key_bucket() const { return key_bucket_; }
  // The current step's longest sequence, in rows (this step's tokens only).
  int64_t step_longest_rows() const { return longest_rows_; }
  // The device memory of the splits' partial results (kSplitBlocks slots).
  float* split_scratch() const { return static_cast<float*>(split_scratch_.get()); }

 private:
  LaunchStream& stream_;
  bool splits_ = true;
  void* host_ = nullptr;  // pinned, two halves of capacity_
  cudaEvent_t copied_[2] = {nullptr, nullptr};
  int half_ = 0;
  bool copy_due_ = false;  // upload_step added a part launch_uploads has not enqueued
  void* device_ = nullptr;
  size_t capacity_ = 0;
  int block_stride_ = 0;
  DeviceStep step_{};
  int key_class_ = 0;
  int key_bucket_ = 0;
  int64_t longest_rows_ = 0;
  std::shared_ptr<void> split_scratch_;
};

}  // namespace kiln::cuda
