// What every part of the CUDA backend shares: CUDA and cuBLAS errors as kiln::Errors, and the
// kernel-side names of kiln's element types and activations.
#pragma once

#include <cublasLt.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <initializer_list>
#include <optional>

#include "backend/cuda/kernels.cuh"
#include "core/tensor.h"
#include "graph/attrs.h"

namespace kiln::cuda {

// Throws a kiln::Error naming the call and the CUDA / cuBLAS error.
void check_cuda(cudaError_t err, const char* call, const char* file, int line);
const char* cublas_status_name(cublasStatus_t status);
void check_cublas(cublasStatus_t status, const char* call, const char* file, int line);
#define KILN_CUDA_CHECK(call) ::kiln::cuda::check_cuda((call), #call, __FILE__, __LINE__)
#define KILN_CUBLAS_CHECK(call) ::kiln::cuda::check_cublas((call), #call, __FILE__, __LINE__)

// The kernel-side element type of a float dtype; throws for others.
FloatType float_type(DType dtype);
IndexType index_type(DType dtype);
// The kernel-side function of a kiln::Activation.
ActFn act_fn(Activation a);
// cuBLASLt's type of a float dtype; throws for others.
cudaDataType_t cublas_type(DType dtype);
// A Linear's matmul: row-major y [n, out] = x [n, in] · w [out, in]^T is column-major y^T = w · x^T
// (A = w, transposed; B = x), `compute` accumulation with alpha and beta of type `scale` (fp32;
// int32 for int8 GEMMs), and cuBLASLt's bias epilogue for a bias of type `bias` where given. The
// caller destroys it.
cublasLtMatmulDesc_t make_linear_matmul_desc(cublasComputeType_t compute,
                                             std::optional<cudaDataType_t> bias,
                                             cudaDataType_t scale = CUDA_R_32F);

// The least alignment of `ptrs` in bytes (at most 256): what cuBLASLt's heuristic is told.
uint32_t pointer_alignment(std::initializer_list<const void*> ptrs);

// The alignment, in bytes, cuBLASLt may assume of each operand (it assumes 256 unless told).
struct MatmulAlignment {
  uint32_t a = 256, b = 256, c = 256, d = 256;
};
// Up to `wanted` of cuBLASLt's heuristic algorithms for `desc` over layouts a, b and c (C and D
// alike) that need at most `workspace` bytes, into results[0, *found); the status of the query
// (success with *found == 0 when it has none).
cublasStatus_t heuristic_algorithms(cublasLtHandle_t handle, cublasLtMatmulDesc_t desc,
                                    cublasLtMatrixLayout_t a, cublasLtMatrixLayout_t b,
                                    cublasLtMatrixLayout_t c, size_t workspace,
                                    const MatmulAlignment& align, int wanted,
                                    cublasLtMatmulHeuristicResult_t* results, int* found);

}  // namespace kiln::cuda
