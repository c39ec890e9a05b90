// cuBLASLt, loaded when a CUDA backend starts rather than when kiln starts. Linked normally, its
// static initialisers cost about half a second in every kiln process — `kiln --version`, every
// CPU run, every test — whether or not a GPU is used. kiln defines the cuBLASLt functions it
// calls (the header's own declarations) as forwards to the library opened with dlopen on first
// use; cublaslt_load_error() says why it could not be opened, for CudaContext to report.
#include <cublasLt.h>
#include <dlfcn.h>

#include <string>

#include "backend/cuda/cublaslt_loader.h"

namespace kiln::cuda {
namespace {

constexpr const char* kLibrary = "libcublasLt.so.13";

struct Library {
  void* handle = nullptr;
  std::string error;
};

const Library& library() {
  static const Library lib = [] {
    Library l;
    l.handle = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
    if (l.handle == nullptr) {
      const char* why = dlerror();
      l.error = std::string("cannot load ") + kLibrary +
                " (CUDA 13's cuBLASLt; put its folder on "
                "LD_LIBRARY_PATH): " +
                (why != nullptr ? why : "unknown error");
    }
    return l;
  }();
  return lib;
}

// The library's function `name`, or null (the forward then reports "not initialized").
template <typename F>
F symbol(const char* name) {
  const Library& lib = library();
  return lib.handle != nullptr ? reinterpret_cast<F>(dlsym(lib.handle, name)) : nullptr;
}

}  // namespace

std::string cublaslt_load_error() {
  const Library& lib = library();
  if (!lib.error.empty()) return lib.error;
  if (dlsym(lib.handle, "cublasLtMatmul") == nullptr)
    return std::string(kLibrary) + " has no cublasLtMatmul: not a cuBLASLt library";
  return {};
}

}  // namespace kiln::cuda

// Each forward resolves its function once; without the library it returns
// CUBLAS_STATUS_NOT_INITIALIZED (CudaContext checks cublaslt_load_error() before any call).
#define KILN_FORWARD(name, params, args)                               \
  cublasStatus_t CUBLASWINAPI name params {                            \
    static const auto fn = kiln::cuda::symbol<decltype(&name)>(#name); \
    return fn != nullptr ? fn args : CUBLAS_STATUS_NOT_INITIALIZED;    \
  }

extern "C" {

size_t CUBLASWINAPI cublasLtGetVersion(void) {
  static const auto fn = kiln::cuda::symbol<decltype(&cublasLtGetVersion)>("cublasLtGetVersion");
  return fn != nullptr ? fn() : 0;
}
KILN_FORWARD(cublasLtCreate, (cublasLtHandle_t * handle), (handle))
KILN_FORWARD(cublasLtDestroy, (cublasLtHandle_t handle), (handle))
KILN_FORWARD(cublasLtMatmulDescCreate,
             (cublasLtMatmulDesc_t * desc, cublasComputeType_t compute, cudaDataType_t scale),
             (desc, compute, scale))
KILN_FORWARD(cublasLtMatmulDescDestroy, (cublasLtMatmulDesc_t desc), (desc))
KILN_FORWARD(cublasLtMatmulDescSetAttribute,
             (cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void* buf,
              size_t bytes),
             (desc, attr, buf, bytes))
KILN_FORWARD(cublasLtMatrixLayoutCreate,
             (cublasLtMatrixLayout_t * layout, cudaDataType type, uint64_t rows, uint64_t cols,
              int64_t ld),
             (layout, type, rows, cols, ld))
KILN_FORWARD(cublasLtMatrixLayoutDestroy, (cublasLtMatrixLayout_t layout), (layout))
KILN_FORWARD(cublasLtMatmulPreferenceCreate, (cublasLtMatmulPreference_t * pref), (pref))
KILN_FORWARD(cublasLtMatmulPreferenceDestroy, (cublasLtMatmulPreference_t pref), (pref))
KILN_FORWARD(cublasLtMatmulPreferenceSetAttribute,
             (cublasLtMatmulPreference_t pref, cublasLtMatmulPreferenceAttributes_t attr,
              const void* buf, size_t bytes),
             (pref, attr, buf, bytes))
KILN_FORWARD(cublasLtMatmulAlgoGetHeuristic,
             (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
              cublasLtMatmulPreference_t pref, int requested,
              cublasLtMatmulHeuristicResult_t results[], int* returned),
             (handle, desc, a, b, c, d, pref, requested, results, returned))
KILN_FORWARD(cublasLtMatmulAlgoCheck,
             (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t a,
              cublasLtMatrixLayout_t b, cublasLtMatrixLayout_t c, cublasLtMatrixLayout_t d,
              const cublasLtMatmulAlgo_t* algo, cublasLtMatmulHeuristicResult_t* result),
             (handle, desc, a, b, c, d, algo, result))
KILN_FORWARD(cublasLtMatmul,
             (cublasLtHandle_t handle, cublasLtMatmulDesc_t desc, const void* alpha, const void* a,
              cublasLtMatrixLayout_t a_desc, const void* b, cublasLtMatrixLayout_t b_desc,
              const void* beta, const void* c, cublasLtMatrixLayout_t c_desc, void* d,
              cublasLtMatrixLayout_t d_desc, const cublasLtMatmulAlgo_t* algo, void* workspace,
              size_t workspace_bytes, cudaStream_t stream),
             (handle, desc, alpha, a, a_desc, b, b_desc, beta, c, c_desc, d, d_desc, algo,
              workspace, workspace_bytes, stream))

}  // extern "C"
