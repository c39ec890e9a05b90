#include "backend/cuda/cuda_common.h"

#include <utility>

namespace kiln::cuda {

void check_cuda(cudaError_t err, const char* call, const char* file, int line) {
  if (err == cudaSuccess) return;
  cudaGetLastError();  // clear a sticky-free error so the next call starts clean
  KILN_FAIL("CUDA error {} ({}) in {} at {}:{}", cudaGetErrorName(err), cudaGetErrorString(err),
            call, file, line);
}

const char* cublas_status_name(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS:
      return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED:
      return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED:
      return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE:
      return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH:
      return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR:
      return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED:
      return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR:
      return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED:
      return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR:
      return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "an unknown cuBLAS status";
}

void check_cublas(cublasStatus_t status, const char* call, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS) return;
  KILN_FAIL("cuBLASLt error {} in {} at {}:{}", cublas_status_name(status), call, file, line);
}

FloatType float_type(DType dtype) {
  switch (dtype) {
    case DType::kF32:
      return FloatType::kF32;
    case DType::kF16:
      return FloatType::kF16;
    case DType::kBF16:
      return FloatType::kBF16;
    case DType::kI8:
    case DType::kI32:
    case DType::kI64:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kI4:
      break;
  }
  KILN_FAIL("the cuda kernels take f32, f16 or bf16 tensors, not {}", dtype_name(dtype));
}

ActFn act_fn(Activation a) {
  switch (a) {
    case Activation::kRelu:
      return ActFn::kRelu;
    case Activation::kGeluTanh:
      return ActFn::kGeluTanh;
    case Activation::kGeluExact:
      return ActFn::kGeluExact;
    case Activation::kSilu:
      return ActFn::kSilu;
  }
  KILN_FAIL("unknown activation {}", static_cast<int>(a));
}

IndexType index_type(DType dtype) {
  switch (dtype) {
    case DType::kI32:
      return IndexType::kI32;
    case DType::kI64:
      return IndexType::kI64;
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kI8:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kI4:
      break;
  }
  KILN_FAIL("the cuda kernels take i32 or i64 indices, not {}", dtype_name(dtype));
}
cudaDataType_t cublas_type(DType dtype) {
  switch (float_type(dtype)) {
    case FloatType::kF32:
      return CUDA_R_32F;
    case FloatType::kF16:
      return CUDA_R_16F;
    case FloatType::kBF16:
      return CUDA_R_16BF;
  }
  return CUDA_R_32F;
}

cublasLtMatmulDesc_t make_linear_matmul_desc(cublasComputeType_t compute,
                                             std::optional<cudaDataType_t> bias,
                                             cudaDataType_t scale) {
  cublasLtMatmulDesc_t desc = nullptr;
  KILN_CUBLAS_CHECK(cublasLtMatmulDescCreate(&desc, compute, scale));
  const cublasOperation_t trans_a = CUBLAS_OP_T, trans_b = CUBLAS_OP_N;
  KILN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof(trans_a)));
  KILN_CUBLAS_CHECK(
      cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof(trans_b)));
  if (bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                                     sizeof(epilogue)));
    KILN_CUBLAS_CHECK(cublasLtMatmulDescSetAttribute(desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                                     &*bias, sizeof(*bias)));
  }
  return desc;
}

uint32_t pointer_alignment(std::initializer_list<const void*> ptrs) {
  uint32_t a = 256;
  for (const void* p : ptrs)
    while ((reinterpret_cast<uintptr_t>(p) & (a - 1)) != 0) a /= 2;
  return a;
}

cublasStatus_t heuristic_algorithms(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                    cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                    cublasLtMatrixLayout_t c, size_t workspace,
                                    const MatmulAlignment& align, int wanted,
                                    cublasLtMatmulHeuristicResult_t* results, int* found) {
  cublasLtMatmulPreference_t pref = nullptr;
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceCreate(&pref));
  KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(
      pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof(workspace)));
  for (auto [attr, value] : {std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, align.a},
                             std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, align.b},
                             std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, align.c},
                             std::pair{CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, align.d}})
    KILN_CUBLAS_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attr, &value, sizeof(uint32_t)));
  *found = 0;
  const cublasStatus_t st =
      cublasLtMatmulAlgoGetHeuristic(handle, desc, a, b, c, c, pref, wanted, results, found);
  cublasLtMatmulPreferenceDestroy(pref);
  return st;
}

}  // namespace kiln::cuda
