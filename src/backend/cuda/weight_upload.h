// A plan's weights to the GPU in one go: the host tensors (views of the mmapped plan, in file
// order) are merged into a few contiguous ranges, given one device allocation laid out like the
// file, and copied by several threads, each reading a chunk of the file into a pinned staging
// buffer while its previous chunk's copy runs on its own stream. No per-tensor synchronization:
// the call returns once every chunk is on the device.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <vector>

#include "core/tensor.h"

namespace kiln::cuda {

// Where each host tensor lands in one device buffer, and the host ranges to copy there.
struct UploadLayout {
  struct Range {
    const char* host = nullptr;  // start of the host bytes
    size_t device_offset = 0;    // where they go in the device buffer
    size_t bytes = 0;
  };
  std::vector<Range> ranges;          // by their first tensor's address (views may overlap)
  std::vector<size_t> device_offset;  // per input tensor: its bytes' offset in the buffer
  size_t device_bytes = 0;            // the buffer's size
  size_t tensor_bytes = 0;            // the tensors' own bytes (ranges may add small gaps)
};

// Host tensors within `max_gap` bytes of each other (in address order) at the same address
// modulo 256 share a range, the gap copied with them. The default, under a page, is safe for
// tensors of different allocations: the gap's bytes lie in the pages of the two tensors' ends,
// which are mapped (a wider gap may hold unmapped memory); a plan's blobs sit 256-aligned in one
// mapping, so they make one range. Every range, so every tensor, starts 256-aligned in the
// device buffer, whatever its host alignment (a checkpoint's tensors may be 2-byte aligned).
// Tensors must be defined, contiguous, on the CPU and non-empty; views of one another are fine.
UploadLayout plan_upload(std::span<const Tensor> hosts, size_t max_gap = 4095);

struct UploadStats {
  int threads = 0;
  size_t chunk_bytes = 0;
  size_t copied_bytes = 0;
  double ms = 0;        // the whole call
  double setup_ms = 0;  // of it: the pinned staging, streams and events
};

// Copies the layout's ranges into `device` (device_bytes long) with `threads` workers and
// staging chunks of `chunk_bytes`, on the current device. Throws on a CUDA error.
UploadStats run_upload(const UploadLayout& layout, void* device, int threads, size_t chunk_bytes);

}  // namespace kiln::cuda
