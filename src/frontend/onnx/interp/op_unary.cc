// Elementwise ops of one operand: Abs, Neg, Relu, Sqrt, Reciprocal, Log, Tanh, Erf (float; Abs, Neg
// and Relu also on integers) and Not (bool).
#include <cmath>
#include <limits>

#include "frontend/onnx/interp/kernel_util.h"
#include "frontend/onnx/interp/kernels.h"

namespace kiln {
namespace {

enum class Domain { kFloatOnly, kSigned };

template <typename F>
void run_unary(OpContext& ctx, std::string_view op, Domain domain, F f) {
  const OnnxElemType type = ctx.input_type(0);
  KILN_CHECK(
      type == OnnxElemType::kFloat || (domain == Domain::kSigned && type != OnnxElemType::kBool),
      "{} does not take {} tensors", op, onnx_elem_type_name(type));
  ImportTensor& y = ctx.set_output(0, type, ctx.input_shape(0));
  if (ctx.shape_only()) return;
  const ImportTensor& x = ctx.input(0);
  visit_numeric(type, op, [&](auto tag) {
    using T = decltype(tag);
    const T* src = x.data<T>();
    T* dst = y.mutable_data<T>();
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(f(src[i]));
  });
}

// Integer negation and absolute value wrap around (two's complement) as onnxruntime's do, without
// signed overflow.
template <typename T>
T wrapping_neg(T v) {
  if constexpr (std::is_floating_point_v<T>) {
    return -v;
  } else {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(U{0} - static_cast<U>(v));
  }
}

}  // namespace

void run_abs(OpContext& ctx) {
  run_unary(ctx, "Abs", Domain::kSigned, [](auto v) {
    using T = decltype(v);
    if constexpr (std::is_unsigned_v<T>)
      return v;
    else
      return v < T{0} ? wrapping_neg(v) : v;
  });
}
void run_neg(OpContext& ctx) {
  run_unary(ctx, "Neg", Domain::kSigned, [](auto v) { return wrapping_neg(v); });
}
void run_relu(OpContext& ctx) {
  run_unary(ctx, "Relu", Domain::kSigned,
            [](auto v) { return v > decltype(v){0} ? v : decltype(v){0}; });
}
void run_sqrt(OpContext& ctx) {
  run_unary(ctx, "Sqrt", Domain::kFloatOnly,
            [](auto v) { return std::sqrt(static_cast<float>(v)); });
}
void run_reciprocal(OpContext& ctx) {
  run_unary(ctx, "Reciprocal", Domain::kFloatOnly,
            [](auto v) { return 1.0f / static_cast<float>(v); });
}
void run_log(OpContext& ctx) {
  run_unary(ctx, "Log", Domain::kFloatOnly, [](auto v) { return std::log(static_cast<float>(v)); });
}
void run_tanh(OpContext& ctx) {
  run_unary(ctx, "Tanh", Domain::kFloatOnly,
            [](auto v) { return std::tanh(static_cast<float>(v)); });
}
void run_erf(OpContext& ctx) {
  run_unary(ctx, "Erf", Domain::kFloatOnly, [](auto v) { return std::erf(static_cast<float>(v)); });
}

void run_not(OpContext& ctx) {
  const OnnxElemType type = ctx.input_type(0);
  KILN_CHECK(type == OnnxElemType::kBool, "Not takes bool tensors, got {}",
             onnx_elem_type_name(type));
  ImportTensor& y = ctx.set_output(0, type, ctx.input_shape(0));
  if (ctx.shape_only()) return;
  const uint8_t* src = ctx.input(0).data<uint8_t>();
  uint8_t* dst = y.mutable_data<uint8_t>();
  const int64_t n = y.numel();
  for (int64_t i = 0; i < n; ++i) dst[i] = src[i] == 0;
}

}  // namespace kiln
