// Element types and their traits table. Quantized block formats are added as new rows: a dtype
// has a block size (elements per block) and bytes per block, so sizes are computed the same way
// for plain and blocked types. The values are not stored anywhere (plans and graphs name dtypes
// by their names), so rows may be added or removed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace kiln {

// kF8E4M3, kF8E5M2: OCP's 8-bit floats (core/fp8.h: their encodings, and how conversions from
// float saturate: E4M3 to ±448, E5M2 not, to ±inf).
// kI4: signed 4-bit integers in [-8, 7] (two's complement), two a byte: element 2j in the low
// nibble of byte j, element 2j + 1 in its high nibble (int4-weight plans' Linear weights, with
// group-wise scales: graph/linear.h). A block is two elements, so a row of an odd length does not
// end on a byte: such tensors have an even number of elements.
enum class DType : uint8_t { kF32, kF16, kBF16, kI8, kI32, kI64, kF8E4M3, kF8E5M2, kI4 };
inline constexpr int kNumDTypes = 9;

struct DTypeTraits {
  DType dtype;
  std::string_view name;         // kiln's name: "f32"
  std::string_view safetensors;  // name in safetensors headers: "F32" (empty: none)
  int block_elems;               // elements per block (1 for plain types)
  int block_bytes;               // bytes per block
  bool is_float;
  // Converts `n` elements (n a multiple of block_elems) to float; null for types without a
  // float view.
  void (*to_float)(const void* src, float* dst, size_t n);
  void (*from_float)(const float* src, void* dst, size_t n);
};

const DTypeTraits& dtype_traits(DType dtype);
std::string_view dtype_name(DType dtype);
// Bytes for `elems` elements; checks that elems is a whole number of blocks.
size_t dtype_bytes(DType dtype, size_t elems);
// Parses kiln names ("f32") and safetensors names ("F32"); throws naming the unknown type.
DType parse_dtype(std::string_view name);
bool try_parse_safetensors_dtype(std::string_view name, DType* out);

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::kF32;
}
template <>
constexpr DType dtype_of<int8_t>() {
  return DType::kI8;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::kI32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::kI64;
}

}  // namespace kiln
