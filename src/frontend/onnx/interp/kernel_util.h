// Shared pieces of the interpreter's kernels: numpy broadcasting, iteration over broadcast
// operands a row at a time, and the one place that maps an ONNX element type to the C++ type a
// kernel is instantiated for.
#pragma once

#include <array>
#include <cstdint>
#include <limits>
#include <string_view>
#include <type_traits>
#include <vector>

#include "frontend/onnx/import_tensor.h"

namespace kiln {

// numpy's multidirectional broadcast of `shapes`; the error lists them.
Shape broadcast_shapes(const std::vector<Shape>& shapes);
// Whether `shape` broadcasts to `target` one way (numpy: right-aligned, each dimension equal or 1,
// rank not above the target's).
bool broadcasts_to(const Shape& shape, const Shape& target);
// Element strides of a contiguous tensor of `shape` read as a tensor of `out` (right-aligned):
// 0 along broadcast dimensions. `shape` must broadcast to `out`.
Shape broadcast_strides(const Shape& shape, const Shape& out);
// Contiguous strides.
Shape row_major_strides(const Shape& shape);

// Calls fn(out_offset, offsets, steps, count) for each innermost row of `out`: element j of the
// row is out_offset + j in the output and offsets[k] + j * steps[k] in operand k.
template <size_t N, typename Fn>
void for_each_row(const Shape& out, const std::array<Shape, N>& strides, Fn&& fn) {
  const int rank = static_cast<int>(out.size());
  std::array<int64_t, N> offsets{}, steps{};
  if (rank == 0) {
    fn(int64_t{0}, offsets, steps, int64_t{1});
    return;
  }
  for (int64_t d : out)
    if (d == 0) return;
  const int64_t inner = out[rank - 1];
  for (size_t k = 0; k < N; ++k) steps[k] = strides[k][rank - 1];
  std::vector<int64_t> index(rank - 1, 0);
  for (int64_t out_offset = 0;; out_offset += inner) {
    fn(out_offset, offsets, steps, inner);
    int d = rank - 2;
    for (; d >= 0; --d) {
      for (size_t k = 0; k < N; ++k) offsets[k] += strides[k][d];
      if (++index[d] < out[d]) break;
      for (size_t k = 0; k < N; ++k) offsets[k] -= strides[k][d] * out[d];
      index[d] = 0;
    }
    if (d < 0) return;
  }
}

// Calls fn(T{}) with the C++ type a numeric kernel computes `type` in: float, int64_t, int32_t,
// int8_t, uint8_t (uint8). Half-precision tensors reach kernels widened to float; bool is not
// numeric. `op` names the kernel in the error.
template <typename Fn>
void visit_numeric(OnnxElemType type, std::string_view op, Fn&& fn) {
  switch (type) {
    case OnnxElemType::kFloat:
      return fn(float{});
    case OnnxElemType::kInt64:
      return fn(int64_t{});
    case OnnxElemType::kInt32:
      return fn(int32_t{});
    case OnnxElemType::kInt8:
      return fn(int8_t{});
    case OnnxElemType::kUint8:
      return fn(uint8_t{});
    case OnnxElemType::kUndefined:
    case OnnxElemType::kUint16:
    case OnnxElemType::kInt16:
    case OnnxElemType::kString:
    case OnnxElemType::kBool:
    case OnnxElemType::kFloat16:
    case OnnxElemType::kDouble:
    case OnnxElemType::kUint32:
    case OnnxElemType::kUint64:
    case OnnxElemType::kComplex64:
    case OnnxElemType::kComplex128:
    case OnnxElemType::kBFloat16:
      break;
  }
  KILN_FAIL("{} does not take {} tensors", op, onnx_elem_type_name(type));
}

// Calls fn(U{}) with an unsigned type of `bytes` bytes (1, 2, 4, 8): kernels that only move
// elements (Transpose, Gather, Concat, ...) work for every type through it.
template <typename Fn>
void visit_element_bytes(size_t bytes, Fn&& fn) {
  if (bytes == 1) return fn(uint8_t{});
  if (bytes == 2) return fn(uint16_t{});
  if (bytes == 4) return fn(uint32_t{});
  if (bytes == 8) return fn(uint64_t{});
  KILN_FAIL("no kernel moves {}-byte elements", bytes);
}

}  // namespace kiln

namespace kiln {

// A float converted to an integer type as x86's conversions do (what onnxruntime computes on this
// machine): truncation toward zero; NaN and values out of range give the type's lowest value for
// int32/int64 (x86's "integer indefinite"), and wrap modulo 2^bits for narrower types (through
// int32, as C++ compilers do). Never C++'s undefined behaviour.
template <typename T>
T float_to_int(double v) {
  if constexpr (sizeof(T) >= 4) {
    // 2^63 and 2^31 are exact doubles: [lo, hi) is the range that converts.
    constexpr double hi = sizeof(T) == 8 ? 9223372036854775808.0 : 2147483648.0;
    if (!(v >= -hi && v < hi)) return std::numeric_limits<T>::min();
    return static_cast<T>(v);
  } else {
    return static_cast<T>(static_cast<uint32_t>(float_to_int<int32_t>(v)));
  }
}

// Two's-complement arithmetic for integers (no undefined overflow), plain for floats.
template <typename T>
T wrap_add(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    return a + b;
  } else {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
  }
}
template <typename T>
T wrap_sub(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    return a - b;
  } else {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(a) - static_cast<U>(b));
  }
}
template <typename T>
T wrap_mul(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    return a * b;
  } else {
    using U = std::make_unsigned_t<T>;
    // uint8/int8 promote to int; multiply as 64-bit unsigned to avoid signed overflow.
    return static_cast<T>(static_cast<U>(static_cast<uint64_t>(static_cast<U>(a)) *
                                         static_cast<uint64_t>(static_cast<U>(b))));
  }
}

}  // namespace kiln
