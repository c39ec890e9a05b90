#include "backend/cuda/cublaslt_handle.h"

#include "backend/cuda/cublaslt_loader.h"
#include "backend/cuda/cuda_allocator.h"

namespace kiln::cuda {

CublasLt::CublasLt() {
  const std::string no_blas = cublaslt_load_error();
  KILN_CHECK_USAGE(no_blas.empty(), "device cuda: {}", no_blas);
  KILN_CUBLAS_CHECK(cublasLtCreate(&handle_));
  workspace_ = malloc_library_workspace(kWorkspaceBytes);
}

CublasLt::~CublasLt() {
  if (workspace_ != nullptr) free_library_workspace(workspace_, kWorkspaceBytes);
  if (handle_ != nullptr) cublasLtDestroy(handle_);
}

}  // namespace kiln::cuda
