// Built instead of src/backend/cuda/ when kiln is configured without CUDA.
#include "backend/cuda_info.h"

namespace kiln {

CudaInfo query_cuda() {
  CudaInfo info;
  info.compiled = false;
  info.error = "kiln was built without CUDA (configure with -DKILN_CUDA=ON)";
  return info;
}

}  // namespace kiln
