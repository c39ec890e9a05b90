// The interpreter's kernels, one per ONNX op (default domain), and the table that finds them.
// Each kernel follows op_context.h's protocol: declare outputs, return when shape_only(), then
// compute. Semantics are ONNX's for opsets 13-18 (ctx.opset() where they differ).
#pragma once

#include <string_view>

#include "frontend/onnx/interp/op_context.h"

namespace kiln {

// How a kernel takes float16/bfloat16 tensors.
enum class HalfPrecision {
  kNative,  // the kernel handles them itself (element moves, Cast, Shape)
  // The caller widens half inputs to float and narrows float outputs back to input 0's type
  // (arithmetic is computed in float, as onnxruntime's CPU kernels do for float16).
  kComputeInFloat,
};

using KernelFn = void (*)(OpContext&);

struct OpKernel {
  std::string_view op;
  KernelFn run;
  HalfPrecision half;
};

// Null for an op the interpreter has no kernel for.
const OpKernel* find_op_kernel(std::string_view op_type);

// op_unary.cc
void run_abs(OpContext& ctx);
void run_neg(OpContext& ctx);
void run_relu(OpContext& ctx);
void run_sqrt(OpContext& ctx);
void run_reciprocal(OpContext& ctx);
void run_log(OpContext& ctx);
void run_tanh(OpContext& ctx);
void run_erf(OpContext& ctx);
void run_not(OpContext& ctx);
void run_is_inf(OpContext& ctx);
void run_clip(OpContext& ctx);
// op_binary.cc
void run_add(OpContext& ctx);
void run_sub(OpContext& ctx);
void run_mul(OpContext& ctx);
void run_div(OpContext& ctx);
void run_pow(OpContext& ctx);
void run_max(OpContext& ctx);
void run_min(OpContext& ctx);
void run_equal(OpContext& ctx);
void run_greater(OpContext& ctx);
void run_greater_or_equal(OpContext& ctx);
void run_less(OpContext& ctx);
void run_less_or_equal(OpContext& ctx);
void run_and(OpContext& ctx);
void run_where(OpContext& ctx);
// op_cast.cc
void run_cast(OpContext& ctx);
// op_constant.cc
void run_constant(OpContext& ctx);
void run_constant_of_shape(OpContext& ctx);
void run_shape(OpContext& ctx);
void run_range(OpContext& ctx);
void run_identity(OpContext& ctx);
// op_reshape.cc
void run_reshape(OpContext& ctx);
void run_flatten(OpContext& ctx);
void run_squeeze(OpContext& ctx);
void run_unsqueeze(OpContext& ctx);
void run_expand(OpContext& ctx);
// op_layout.cc
void run_transpose(OpContext& ctx);
void run_concat(OpContext& ctx);
void run_split(OpContext& ctx);
// op_slice.cc
void run_slice(OpContext& ctx);
// op_gather.cc
void run_gather(OpContext& ctx);
void run_gather_nd(OpContext& ctx);
// op_matmul.cc
void run_matmul(OpContext& ctx);
void run_gemm(OpContext& ctx);
// op_normalize.cc
void run_softmax(OpContext& ctx);
void run_layer_normalization(OpContext& ctx);
void run_reduce_mean(OpContext& ctx);
void run_reduce_sum(OpContext& ctx);
// op_cumsum_trilu.cc
void run_cumsum(OpContext& ctx);
void run_trilu(OpContext& ctx);

}  // namespace kiln
