// What CUDA support kiln was built with and which GPUs it sees. Kept free of C++20 so that nvcc
// compiles it in CUDA sources.
#pragma once

#include <cstddef>
#include <string>
#include <vector>

#include "backend/backend_option.h"

namespace kiln {

struct CudaInfo {
  bool compiled = false;
  int device_count = 0;
  std::string first_device;  // name and compute capability of device 0
  int first_sm = 0;          // device 0's compute capability (90 for sm_90), 0 without one
  int compiled_sm = 0;       // the lowest architecture kiln's CUDA kernels were compiled for
  std::string error;         // why no device was found, when compiled
};
CudaInfo query_cuda();

// The architecture a CUDA plan built on this machine is for: "sm_" + GPU 0's compute capability,
// or, without a GPU, the one kiln's kernels were compiled for. Empty without CUDA support.
std::string cuda_build_target();

// GPU 0's memory bandwidth as kiln measures it: the best of `passes` device-to-device copies of
// `bytes`, timed with CUDA events, counting the bytes read and written (1e9 bytes per second).
// 0 when there is no GPU.
double measure_cuda_bandwidth_gbps(size_t bytes = size_t{1} << 30, int passes = 10);
// Device memory in use on GPU 0 (total - free, every process and context), -1 without a GPU.
long long cuda_memory_used_bytes();
// Restarts the high-water mark that cuda_memory_peak_bytes() reports.
void cuda_memory_peak_reset();
// Device memory in use on GPU 0 at its highest since cuda_memory_peak_reset(): in use now, plus
// what kiln's device allocations (blocks kept in its allocator's cache included) held at their
// peak beyond what they hold now. -1 without a GPU.
long long cuda_memory_peak_bytes();
// Device bytes kiln's allocations hold now (weights, KV cache, workspaces, the allocator's cached
// blocks, the libraries' workspaces): what cuda_memory_used_bytes() holds beyond the CUDA
// context, its loaded kernels and other processes. 0 without a GPU.
long long cuda_memory_held_bytes();
// Of those, the libraries' fixed workspaces (cuBLASLt's), 0 without a GPU.
long long cuda_library_workspace_bytes();

// The options a CUDA backend made now would run with (its options struct filled from the
// KILN_CUDA_* variables: what `kiln inspect --device` prints, GPU or not); throws a usage error
// naming a variable with a bad value. Empty in a build without CUDA.
std::vector<BackendOption> cuda_options();

}  // namespace kiln
