#include "backend/cuda/cuda_context.h"

namespace kiln::cuda {

CudaDevice CudaDevice::open(int ordinal) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) cudaGetLastError();
  KILN_CHECK_USAGE(err == cudaSuccess && count > 0, "device cuda: no CUDA GPU is visible ({})",
                   err == cudaSuccess ? "0 devices" : cudaGetErrorString(err));
  KILN_CHECK_USAGE(ordinal >= 0 && ordinal < count, "device cuda:{}: {} CUDA GPU(s) visible",
                   ordinal, count);
  KILN_CUDA_CHECK(cudaSetDevice(ordinal));
  cudaDeviceProp prop{};
  KILN_CUDA_CHECK(cudaGetDeviceProperties(&prop, ordinal));
  CudaDevice d;
  d.ordinal = ordinal;
  d.name = prop.name;
  d.sm = prop.major * 10 + prop.minor;
  d.multiprocessors = prop.multiProcessorCount;
  KILN_CHECK_USAGE(d.sm >= 80, "device cuda: {} is sm_{}; kiln's CUDA kernels need sm_80 or newer",
                   d.name, d.sm);
  return d;
}

CudaContext::CudaContext(Context& host, int ordinal, const CudaOptions& options)
    : host_(host),
      device_(CudaDevice::open(ordinal)),
      options_(options),
      launch_(device_.sm >= 90 && options.programmatic_launch),
      allocator_(launch_.stream(), ordinal),
      blas_(),
      checks_(launch_, host.log(), options.defer_checks),
      uploads_(launch_, allocator_, options.splits),
      weights_(allocator_, launch_.stream(), options.upload_threads, options.upload_chunk_mib) {
  allocator_.set_after_read([this] { checks_.synchronize(); });
}

CudaContext::~CudaContext() {
  // The parts give their device buffers back while the stream exists: nothing queued may still
  // read them.
  cudaStreamSynchronize(launch_.stream());
}

}  // namespace kiln::cuda
