#include "frontend/onnx/interp/kernels.h"

#include <algorithm>
#include <array>

namespace kiln {
namespace {

constexpr HalfPrecision kNative = HalfPrecision::kNative;
constexpr HalfPrecision kFloat = HalfPrecision::kComputeInFloat;

// Sorted by op: binary search. supported_ops.cc lists the same ops (a test checks that every
// supported op has a kernel).
constexpr std::array<OpKernel, 50> kKernels = {{
    {"Abs", run_abs, kFloat},
    {"Add", run_add, kFloat},
    {"And", run_and, kNative},
    {"Cast", run_cast, kNative},
    {"Clip", run_clip, kFloat},
    {"Concat", run_concat, kNative},
    {"Constant", run_constant, kNative},
    {"ConstantOfShape", run_constant_of_shape, kNative},
    {"CumSum", run_cumsum, kFloat},
    {"Div", run_div, kFloat},
    {"Equal", run_equal, kFloat},
    {"Erf", run_erf, kFloat},
    {"Expand", run_expand, kNative},
    {"Flatten", run_flatten, kNative},
    {"Gather", run_gather, kNative},
    {"GatherND", run_gather_nd, kNative},
    {"Gemm", run_gemm, kFloat},
    {"Greater", run_greater, kFloat},
    {"GreaterOrEqual", run_greater_or_equal, kFloat},
    {"Identity", run_identity, kNative},
    {"IsInf", run_is_inf, kFloat},
    {"LayerNormalization", run_layer_normalization, kFloat},
    {"Less", run_less, kFloat},
    {"LessOrEqual", run_less_or_equal, kFloat},
    {"Log", run_log, kFloat},
    {"MatMul", run_matmul, kFloat},
    {"Max", run_max, kFloat},
    {"Min", run_min, kFloat},
    {"Mul", run_mul, kFloat},
    {"Neg", run_neg, kFloat},
    {"Not", run_not, kNative},
    {"Pow", run_pow, kFloat},
    {"Range", run_range, kFloat},
    {"Reciprocal", run_reciprocal, kFloat},
    {"ReduceMean", run_reduce_mean, kFloat},
    {"ReduceSum", run_reduce_sum, kFloat},
    {"Relu", run_relu, kFloat},
    {"Reshape", run_reshape, kNative},
    {"Shape", run_shape, kNative},
    {"Slice", run_slice, kNative},
    {"Softmax", run_softmax, kFloat},
    {"Split", run_split, kNative},
    {"Sqrt", run_sqrt, kFloat},
    {"Squeeze", run_squeeze, kNative},
    {"Sub", run_sub, kFloat},
    {"Tanh", run_tanh, kFloat},
    {"Transpose", run_transpose, kNative},
    {"Trilu", run_trilu, kNative},
    {"Unsqueeze", run_unsqueeze, kNative},
    {"Where", run_where, kNative},
}};

constexpr bool sorted_by_op() {
  for (size_t i = 1; i < kKernels.size(); ++i)
    if (!(kKernels[i - 1].op < kKernels[i].op)) return false;
  return true;
}
static_assert(sorted_by_op(), "kKernels must be sorted by op");

}  // namespace

const OpKernel* find_op_kernel(std::string_view op_type) {
  const auto it =
      std::lower_bound(kKernels.begin(), kKernels.end(), op_type,
                       [](const OpKernel& k, std::string_view op) { return k.op < op; });
  return it != kKernels.end() && it->op == op_type ? &*it : nullptr;
}

}  // namespace kiln
