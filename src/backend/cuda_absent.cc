// Built instead of src/backend/cuda/ when kiln is configured without CUDA.
#include "backend/backend.h"
#include "backend/cuda_info.h"

namespace kiln {

CudaInfo query_cuda() {
  CudaInfo info;
  info.compiled = false;
  info.error = "kiln was built without CUDA (configure with -DKILN_CUDA=ON)";
  return info;
}

std::string cuda_build_target() { return {}; }

double measure_cuda_bandwidth_gbps(size_t, int) { return 0.0; }

long long cuda_memory_used_bytes() { return -1; }

void cuda_memory_peak_reset() {}

long long cuda_memory_peak_bytes() { return -1; }

long long cuda_memory_held_bytes() { return 0; }

long long cuda_library_workspace_bytes() { return 0; }

std::vector<BackendOption> cuda_options() { return {}; }

// Reached by loading a cuda plan (a build refuses --device cuda before): a runtime error, like a
// machine without a GPU, naming the fix.
std::unique_ptr<Backend> make_cuda_backend(Context&, int) {
  KILN_FAIL(
      "device cuda: {}; this plan was built with --device cuda: rebuild it with --device "
      "cpu to run it with this kiln",
      query_cuda().error);
}

}  // namespace kiln
