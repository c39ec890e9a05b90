// Reports the CUDA runtime and devices kiln can see (for `kiln --version` and GPU tests).
#include <cuda_runtime.h>

#include "backend/cuda_info.h"

namespace kiln {

CudaInfo query_cuda() {
  CudaInfo info;
  info.compiled = true;
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    info.error = cudaGetErrorString(err);
    return info;
  }
  info.device_count = count;
  if (count > 0) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess)
      info.first_device = std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
                          std::to_string(prop.minor) + ")";
  }
  return info;
}

}  // namespace kiln
