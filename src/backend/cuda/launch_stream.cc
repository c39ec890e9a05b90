#include "backend/cuda/launch_stream.h"

#include "backend/cuda/cuda_common.h"

namespace kiln::cuda {

LaunchStream::LaunchStream(bool programmatic) : programmatic_(programmatic) {
  KILN_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
}

LaunchStream::~LaunchStream() {
  if (stream_ == nullptr) return;
  cudaStreamSynchronize(stream_);
  cudaStreamDestroy(stream_);
}

}  // namespace kiln::cuda
