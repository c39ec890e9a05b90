// Elementwise ops of one operand: Abs, Neg, Relu, Sqrt, Reciprocal, Log, Tanh, Erf (float; Abs, Neg
// and Relu also on integers), Not (bool), IsInf (float to bool) and Clip (between optional
// scalar bounds).
#include <algorithm>
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

// IsInf(x): true where x is +inf (detect_positive, default 1) or -inf (detect_negative, default
// 1). HF T5's fp16 overflow clamp tests its activations with it.
void run_is_inf(OpContext& ctx) {
  const OnnxElemType type = ctx.input_type(0);
  KILN_CHECK(type == OnnxElemType::kFloat, "IsInf takes float tensors, got {}",
             onnx_elem_type_name(type));
  const bool positive = ctx.attr_int("detect_positive", 1) != 0;
  const bool negative = ctx.attr_int("detect_negative", 1) != 0;
  ImportTensor& y = ctx.set_output(0, OnnxElemType::kBool, ctx.input_shape(0));
  if (ctx.shape_only()) return;
  const float* src = ctx.input(0).data<float>();
  uint8_t* dst = y.mutable_data<uint8_t>();
  const int64_t n = y.numel();
  for (int64_t i = 0; i < n; ++i) dst[i] = std::isinf(src[i]) && (src[i] > 0 ? positive : negative);
}

// Clip(x[, min][, max]) (opset 11 on: the bounds are optional scalar inputs): each element
// limited to [min, max]; NaN stays NaN; a min above max gives max everywhere, as onnxruntime's
// min(max(x, min), max) does.
void run_clip(OpContext& ctx) {
  const OnnxElemType type = ctx.input_type(0);
  KILN_CHECK(type != OnnxElemType::kBool, "Clip does not take bool tensors");
  for (int i = 1; i < 3; ++i) {
    if (!ctx.has_input(i)) continue;
    KILN_CHECK(ctx.input_type(i) == type, "Clip's {} is {}, its input {}", i == 1 ? "min" : "max",
               onnx_elem_type_name(ctx.input_type(i)), onnx_elem_type_name(type));
    KILN_CHECK(shape_numel(ctx.input_shape(i)) == 1, "Clip's {} must be a scalar, got shape {}",
               i == 1 ? "min" : "max", shape_str(ctx.input_shape(i)));
  }
  ImportTensor& y = ctx.set_output(0, type, ctx.input_shape(0));
  if (ctx.shape_only()) return;
  const ImportTensor& x = ctx.input(0);
  visit_numeric(type, "Clip", [&](auto tag) {
    using T = decltype(tag);
    const T lo = ctx.has_input(1) ? ctx.input(1).data<T>()[0] : std::numeric_limits<T>::lowest();
    const T hi = ctx.has_input(2) ? ctx.input(2).data<T>()[0] : std::numeric_limits<T>::max();
    const T* src = x.data<T>();
    T* dst = y.mutable_data<T>();
    const int64_t n = x.numel();
    for (int64_t i = 0; i < n; ++i) {
      const T v = src[i];
      if constexpr (std::is_floating_point_v<T>)
        if (std::isnan(v)) {
          dst[i] = v;
          continue;
        }
      dst[i] = std::min(std::max(v, lo), hi);
    }
  });
}

}  // namespace kiln
