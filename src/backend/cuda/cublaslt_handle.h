// A context's cuBLASLt: the handle and its fixed workspace (counted as the library's in the
// memory statistics, cuda_info.h).
#pragma once

#include <cublasLt.h>

#include <cstddef>

namespace kiln::cuda {

class CublasLt {
 public:
  // Throws a usage error when libcublasLt cannot be opened.
  CublasLt();
  ~CublasLt();
  CublasLt(const CublasLt&) = delete;
  CublasLt& operator=(const CublasLt&) = delete;

  cublasLtHandle_t handle() const { return handle_; }
  void* workspace() const { return workspace_; }
  size_t workspace_bytes() const { return kWorkspaceBytes; }

 private:
  static constexpr size_t kWorkspaceBytes = 32u << 20;
  cublasLtHandle_t handle_ = nullptr;
  void* workspace_ = nullptr;
};

}  // namespace kiln::cuda
