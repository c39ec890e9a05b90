// Reports the CUDA runtime and devices kiln can see (for `kiln --version` and GPU tests).
#include <cuda_runtime.h>

#include "backend/cuda_info.h"

namespace kiln {

CudaInfo query_cuda() {
  CudaInfo info;
  info.compiled = true;
#ifdef __CUDA_ARCH_LIST__
  constexpr int kArchs[] = {__CUDA_ARCH_LIST__};  // e.g. 900 for sm_90
  info.compiled_sm = kArchs[0] / 10;
#endif
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
      info.first_sm = prop.major * 10 + prop.minor;
    if (info.first_sm > 0)
      info.first_device = std::string(prop.name) + " (sm_" + std::to_string(prop.major) +
                          std::to_string(prop.minor) + ")";
  }
  return info;
}

std::string cuda_build_target() {
  const CudaInfo info = query_cuda();
  const int sm = info.first_sm > 0 ? info.first_sm : info.compiled_sm;
  return sm > 0 ? "sm_" + std::to_string(sm) : std::string();
}

double measure_cuda_bandwidth_gbps(size_t bytes, int passes) {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0) {
    cudaGetLastError();
    return 0.0;
  }
  void* src = nullptr;
  void* dst = nullptr;
  cudaEvent_t start = nullptr, stop = nullptr;
  double best = 0.0;
  if (cudaMalloc(&src, bytes) == cudaSuccess && cudaMalloc(&dst, bytes) == cudaSuccess &&
      cudaEventCreate(&start) == cudaSuccess && cudaEventCreate(&stop) == cudaSuccess) {
    cudaMemset(src, 1, bytes);
    cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice);  // warm-up
    for (int i = 0; i < passes; ++i) {
      cudaEventRecord(start);
      cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice);
      cudaEventRecord(stop);
      cudaEventSynchronize(stop);
      float ms = 0.0f;
      cudaEventElapsedTime(&ms, start, stop);
      if (ms > 0.0f) {
        const double gbps = 2.0 * static_cast<double>(bytes) / (ms * 1e-3) / 1e9;
        if (gbps > best) best = gbps;
      }
    }
  }
  cudaGetLastError();
  if (start != nullptr) cudaEventDestroy(start);
  if (stop != nullptr) cudaEventDestroy(stop);
  cudaFree(src);
  cudaFree(dst);
  return best;
}

long long cuda_memory_used_bytes() {
  size_t free_bytes = 0, total = 0;
  if (cudaMemGetInfo(&free_bytes, &total) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  return static_cast<long long>(total - free_bytes);
}

}  // namespace kiln
