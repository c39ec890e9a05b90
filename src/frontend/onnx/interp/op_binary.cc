// Broadcasting elementwise ops (numpy rules): arithmetic (Add, Sub, Mul, Div, Pow, variadic Max
// and Min), comparisons (Equal, Greater, GreaterOrEqual, Less, LessOrEqual), And, and Where.
// Integer arithmetic wraps around; integer division truncates toward zero and refuses a zero
// divisor (onnxruntime's CPU kernels crash on one).
#include <cmath>

#include "frontend/onnx/interp/kernel_util.h"
#include "frontend/onnx/interp/kernels.h"

namespace kiln {
namespace {

// y[i] = f(a[i], b[i]) over broadcast operands; A, B and R are the storage types.
template <typename A, typename B, typename R, typename F>
void broadcast_apply(const ImportTensor& a, const ImportTensor& b, ImportTensor& y, F f) {
  const A* pa = a.data<A>();
  const B* pb = b.data<B>();
  R* py = y.mutable_data<R>();
  const std::array<Shape, 2> strides = {broadcast_strides(a.shape(), y.shape()),
                                        broadcast_strides(b.shape(), y.shape())};
  for_each_row<2>(y.shape(), strides, [&](int64_t o, const auto& off, const auto& step, int64_t n) {
    for (int64_t j = 0; j < n; ++j)
      py[o + j] = f(pa[off[0] + j * step[0]], pb[off[1] + j * step[1]]);
  });
}

// The type both operands must share; bool only where `allow_bool`.
OnnxElemType common_type(const OpContext& ctx, std::string_view op, bool allow_bool) {
  const OnnxElemType a = ctx.input_type(0), b = ctx.input_type(1);
  KILN_CHECK(a == b, "{} needs operands of one type, got {} and {}", op, onnx_elem_type_name(a),
             onnx_elem_type_name(b));
  KILN_CHECK(allow_bool || a != OnnxElemType::kBool, "{} does not take bool tensors", op);
  return a;
}

template <typename F>
void run_arithmetic(OpContext& ctx, std::string_view op, F f) {
  const OnnxElemType type = common_type(ctx, op, false);
  ImportTensor& y =
      ctx.set_output(0, type, broadcast_shapes({ctx.input_shape(0), ctx.input_shape(1)}));
  if (ctx.shape_only()) return;
  visit_numeric(type, op, [&](auto tag) {
    using T = decltype(tag);
    broadcast_apply<T, T, T>(ctx.input(0), ctx.input(1), y, [&](T a, T b) { return f(a, b); });
  });
}

// Bool operands compare as uint8 (Equal).
template <typename F>
void run_comparison(OpContext& ctx, std::string_view op, bool allow_bool, F f) {
  const OnnxElemType type = common_type(ctx, op, allow_bool);
  ImportTensor& y = ctx.set_output(0, OnnxElemType::kBool,
                                   broadcast_shapes({ctx.input_shape(0), ctx.input_shape(1)}));
  if (ctx.shape_only()) return;
  visit_numeric(type == OnnxElemType::kBool ? OnnxElemType::kUint8 : type, op, [&](auto tag) {
    using T = decltype(tag);
    if (type == OnnxElemType::kBool) {
      broadcast_apply<uint8_t, uint8_t, uint8_t>(
          ctx.input(0), ctx.input(1), y,
          [&](uint8_t a, uint8_t b) -> uint8_t { return f(a != 0, b != 0); });
    } else {
      broadcast_apply<T, T, uint8_t>(ctx.input(0), ctx.input(1), y,
                                     [&](T a, T b) -> uint8_t { return f(a, b); });
    }
  });
}

// Max and Min take one or more operands, all broadcast together.
template <typename F>
void run_variadic(OpContext& ctx, std::string_view op, F pick) {
  KILN_CHECK(ctx.input_count() >= 1, "{} needs at least one input", op);
  std::vector<Shape> shapes;
  const OnnxElemType type = ctx.input_type(0);
  KILN_CHECK(type != OnnxElemType::kBool, "{} does not take bool tensors", op);
  for (int i = 0; i < ctx.input_count(); ++i) {
    KILN_CHECK(ctx.input_type(i) == type, "{} needs operands of one type, got {} and {}", op,
               onnx_elem_type_name(type), onnx_elem_type_name(ctx.input_type(i)));
    shapes.push_back(ctx.input_shape(i));
  }
  const Shape out = broadcast_shapes(shapes);
  ImportTensor& y = ctx.set_output(0, type, out);
  if (ctx.shape_only()) return;
  visit_numeric(type, op, [&](auto tag) {
    using T = decltype(tag);
    // y = input 0 broadcast, then folded with each further input.
    ImportTensor first = ImportTensor::zeros(type, {});
    broadcast_apply<T, T, T>(ctx.input(0), first, y, [](T a, T) { return a; });
    for (int i = 1; i < ctx.input_count(); ++i) {
      const ImportTensor acc = y;  // the previous result; y is rewritten in place below
      ImportTensor next = ImportTensor::zeros(type, out);
      broadcast_apply<T, T, T>(acc, ctx.input(i), next, [&](T a, T b) { return pick(a, b); });
      y = next;
    }
  });
}

template <typename T>
T checked_div(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    return a / b;
  } else {
    KILN_CHECK(b != 0, "integer division by zero");
    if constexpr (std::is_signed_v<T>)
      if (b == -1) return wrap_sub(T{0}, a);  // lowest / -1 wraps instead of trapping
    return static_cast<T>(a / b);
  }
}

}  // namespace

void run_add(OpContext& ctx) {
  run_arithmetic(ctx, "Add", [](auto a, auto b) { return wrap_add(a, b); });
}
void run_sub(OpContext& ctx) {
  run_arithmetic(ctx, "Sub", [](auto a, auto b) { return wrap_sub(a, b); });
}
void run_mul(OpContext& ctx) {
  run_arithmetic(ctx, "Mul", [](auto a, auto b) { return wrap_mul(a, b); });
}
void run_div(OpContext& ctx) {
  run_arithmetic(ctx, "Div", [](auto a, auto b) { return checked_div(a, b); });
}

// Pow(X, Y): Y may have another numeric type than X; the result has X's type. Integer bases are
// raised in double and converted back like a Cast.
void run_pow(OpContext& ctx) {
  const OnnxElemType type = ctx.input_type(0);
  const OnnxElemType exponent_type = ctx.input_type(1);
  KILN_CHECK(type != OnnxElemType::kBool && exponent_type != OnnxElemType::kBool,
             "Pow does not take bool tensors");
  ImportTensor& y =
      ctx.set_output(0, type, broadcast_shapes({ctx.input_shape(0), ctx.input_shape(1)}));
  if (ctx.shape_only()) return;
  const ImportTensor& e = ctx.input(1);
  const ImportTensor exponent =
      ImportTensor::from_vector(OnnxElemType::kFloat, e.shape(), e.to_floats());
  visit_numeric(type, "Pow", [&](auto tag) {
    using T = decltype(tag);
    broadcast_apply<T, float, T>(ctx.input(0), exponent, y, [](T a, float b) -> T {
      if constexpr (std::is_floating_point_v<T>) {
        if (b == 2.0f) return a * a;  // exact, as onnxruntime's special case
        return std::pow(a, b);
      } else {
        return float_to_int<T>(std::pow(static_cast<double>(a), static_cast<double>(b)));
      }
    });
  });
}

// NaN propagates through Max and Min (onnxruntime's Eigen kernels).
void run_max(OpContext& ctx) {
  run_variadic(ctx, "Max", [](auto a, auto b) {
    if constexpr (std::is_floating_point_v<decltype(a)>)
      if (std::isnan(a) || std::isnan(b)) return std::isnan(a) ? a : b;
    return a < b ? b : a;
  });
}
void run_min(OpContext& ctx) {
  run_variadic(ctx, "Min", [](auto a, auto b) {
    if constexpr (std::is_floating_point_v<decltype(a)>)
      if (std::isnan(a) || std::isnan(b)) return std::isnan(a) ? a : b;
    return b < a ? b : a;
  });
}

void run_equal(OpContext& ctx) {
  run_comparison(ctx, "Equal", true, [](auto a, auto b) { return a == b; });
}
void run_greater(OpContext& ctx) {
  run_comparison(ctx, "Greater", false, [](auto a, auto b) { return a > b; });
}
void run_greater_or_equal(OpContext& ctx) {
  run_comparison(ctx, "GreaterOrEqual", false, [](auto a, auto b) { return a >= b; });
}
void run_less(OpContext& ctx) {
  run_comparison(ctx, "Less", false, [](auto a, auto b) { return a < b; });
}
void run_less_or_equal(OpContext& ctx) {
  run_comparison(ctx, "LessOrEqual", false, [](auto a, auto b) { return a <= b; });
}

void run_and(OpContext& ctx) {
  KILN_CHECK(ctx.input_type(0) == OnnxElemType::kBool && ctx.input_type(1) == OnnxElemType::kBool,
             "And takes bool tensors, got {} and {}", onnx_elem_type_name(ctx.input_type(0)),
             onnx_elem_type_name(ctx.input_type(1)));
  ImportTensor& y = ctx.set_output(0, OnnxElemType::kBool,
                                   broadcast_shapes({ctx.input_shape(0), ctx.input_shape(1)}));
  if (ctx.shape_only()) return;
  broadcast_apply<uint8_t, uint8_t, uint8_t>(
      ctx.input(0), ctx.input(1), y,
      [](uint8_t a, uint8_t b) -> uint8_t { return a != 0 && b != 0; });
}

// Where(condition, X, Y): X where the condition holds, else Y; all three broadcast.
void run_where(OpContext& ctx) {
  KILN_CHECK(ctx.input_type(0) == OnnxElemType::kBool, "Where's condition must be bool, got {}",
             onnx_elem_type_name(ctx.input_type(0)));
  const OnnxElemType type = ctx.input_type(1);
  KILN_CHECK(ctx.input_type(2) == type, "Where needs X and Y of one type, got {} and {}",
             onnx_elem_type_name(type), onnx_elem_type_name(ctx.input_type(2)));
  const Shape out = broadcast_shapes({ctx.input_shape(0), ctx.input_shape(1), ctx.input_shape(2)});
  ImportTensor& y = ctx.set_output(0, type, out);
  if (ctx.shape_only()) return;
  const ImportTensor &c = ctx.input(0), &a = ctx.input(1), &b = ctx.input(2);
  const std::array<Shape, 3> strides = {broadcast_strides(c.shape(), out),
                                        broadcast_strides(a.shape(), out),
                                        broadcast_strides(b.shape(), out)};
  visit_element_bytes(y.element_bytes(), [&](auto tag) {
    using E = decltype(tag);
    const uint8_t* pc = c.data<uint8_t>();
    const E* pa = static_cast<const E*>(a.raw());
    const E* pb = static_cast<const E*>(b.raw());
    E* py = static_cast<E*>(y.mutable_raw());
    for_each_row<3>(out, strides, [&](int64_t o, const auto& off, const auto& step, int64_t n) {
      for (int64_t j = 0; j < n; ++j)
        py[o + j] =
            pc[off[0] + j * step[0]] != 0 ? pa[off[1] + j * step[1]] : pb[off[2] + j * step[2]];
    });
  });
}

}  // namespace kiln
