// What CUDA support kiln was built with and which GPUs it sees. Kept free of C++20 so that nvcc
// compiles it in CUDA sources.
#pragma once

#include <string>

namespace kiln {

struct CudaInfo {
  bool compiled = false;
  int device_count = 0;
  std::string first_device;  // name and compute capability of device 0
  std::string error;         // why no device was found, when compiled
};
CudaInfo query_cuda();

}  // namespace kiln
