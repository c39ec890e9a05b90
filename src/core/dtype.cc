#include "core/dtype.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <string>

#include "core/fp8.h"
#include "core/half.h"
#include "core/status.h"

namespace kiln {
namespace {

template <typename T>
void int_to_float(const void* src, float* dst, size_t n) {
  const T* s = static_cast<const T*>(src);
  for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(s[i]);
}
template <typename T>
void int_from_float(const float* src, void* dst, size_t n) {
  T* d = static_cast<T*>(dst);
  for (size_t i = 0; i < n; ++i) d[i] = static_cast<T>(src[i]);
}
void f32_to_float(const void* src, float* dst, size_t n) { std::memcpy(dst, src, n * 4); }
void f32_from_float(const float* src, void* dst, size_t n) { std::memcpy(dst, src, n * 4); }
void f16_to_float(const void* src, float* dst, size_t n) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  for (size_t i = 0; i < n; ++i) dst[i] = fp16_to_float(s[i]);
}
void f16_from_float(const float* src, void* dst, size_t n) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  for (size_t i = 0; i < n; ++i) d[i] = float_to_fp16(src[i]);
}
void bf16_to_float_n(const void* src, float* dst, size_t n) {
  const uint16_t* s = static_cast<const uint16_t*>(src);
  for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_float(s[i]);
}
void bf16_from_float_n(const float* src, void* dst, size_t n) {
  uint16_t* d = static_cast<uint16_t*>(dst);
  for (size_t i = 0; i < n; ++i) d[i] = float_to_bf16(src[i]);
}

void f8_e4m3_to_float(const void* src, float* dst, size_t n) {
  const auto* s = static_cast<const uint8_t*>(src);
  for (size_t i = 0; i < n; ++i) dst[i] = fp8_e4m3_to_float(s[i]);
}
void f8_e4m3_from_float(const float* src, void* dst, size_t n) {
  auto* d = static_cast<uint8_t*>(dst);
  for (size_t i = 0; i < n; ++i) d[i] = float_to_fp8_e4m3(src[i]);
}
void f8_e5m2_to_float(const void* src, float* dst, size_t n) {
  const auto* s = static_cast<const uint8_t*>(src);
  for (size_t i = 0; i < n; ++i) dst[i] = fp8_e5m2_to_float(s[i]);
}
void f8_e5m2_from_float(const float* src, void* dst, size_t n) {
  auto* d = static_cast<uint8_t*>(dst);
  for (size_t i = 0; i < n; ++i) d[i] = float_to_fp8_e5m2(src[i]);
}

// Two's-complement nibbles, two a byte (low nibble first); from float: rounded to nearest
// (ties to even) and clamped to [-8, 7].
void i4_to_float(const void* src, float* dst, size_t n) {
  const auto* s = static_cast<const uint8_t*>(src);
  for (size_t i = 0; i < n; ++i) {
    const int nibble = (s[i / 2] >> (4 * (i % 2))) & 0xF;
    dst[i] = static_cast<float>(nibble >= 8 ? nibble - 16 : nibble);
  }
}
void i4_from_float(const float* src, void* dst, size_t n) {
  auto* d = static_cast<uint8_t*>(dst);
  for (size_t i = 0; i < n; i += 2) {
    uint8_t byte = 0;
    for (size_t u = 0; u < 2; ++u) {
      const float v = std::nearbyint(std::clamp(src[i + u], -8.0f, 7.0f));
      byte |= static_cast<uint8_t>((static_cast<int>(v) & 0xF) << (4 * u));
    }
    d[i / 2] = byte;
  }
}

// Indexed by DType; the static_asserts below keep the order honest.
constexpr std::array<DTypeTraits, kNumDTypes> kTraits = {{
    {DType::kF32, "f32", "F32", 1, 4, true, f32_to_float, f32_from_float},
    {DType::kF16, "f16", "F16", 1, 2, true, f16_to_float, f16_from_float},
    {DType::kBF16, "bf16", "BF16", 1, 2, true, bf16_to_float_n, bf16_from_float_n},
    {DType::kI8, "i8", "I8", 1, 1, false, int_to_float<int8_t>, int_from_float<int8_t>},
    {DType::kI32, "i32", "I32", 1, 4, false, int_to_float<int32_t>, int_from_float<int32_t>},
    {DType::kI64, "i64", "I64", 1, 8, false, int_to_float<int64_t>, int_from_float<int64_t>},
    // No safetensors names ("F8_E4M3", "F8_E5M2") yet: checkpoints store fp8 weights with scale
    // tensors beside them ("weight_scale"), which the frontends do not apply; reading the weights
    // alone would load a wrong model without a word, so such checkpoints stay refused.
    {DType::kF8E4M3, "f8_e4m3", "", 1, 1, true, f8_e4m3_to_float, f8_e4m3_from_float},
    {DType::kF8E5M2, "f8_e5m2", "", 1, 1, true, f8_e5m2_to_float, f8_e5m2_from_float},
    // No safetensors name: checkpoints do not store kiln's int4 layout (its group scales are a
    // tensor of their own); int4 weights come from quantizing at build time.
    {DType::kI4, "i4", "", 2, 1, false, i4_to_float, i4_from_float},
}};

constexpr bool traits_in_order() {
  for (int i = 0; i < kNumDTypes; ++i)
    if (static_cast<int>(kTraits[i].dtype) != i) return false;
  return true;
}
static_assert(traits_in_order(), "kTraits must be indexed by DType");

}  // namespace

const DTypeTraits& dtype_traits(DType dtype) {
  const auto index = static_cast<size_t>(dtype);
  KILN_CHECK(index < kTraits.size(), "invalid dtype value {}", index);
  return kTraits[index];
}

std::string_view dtype_name(DType dtype) { return dtype_traits(dtype).name; }

size_t dtype_bytes(DType dtype, size_t elems) {
  const DTypeTraits& t = dtype_traits(dtype);
  KILN_CHECK(elems % static_cast<size_t>(t.block_elems) == 0,
             "{} elements is not a whole number of {}-element {} blocks", elems, t.block_elems,
             t.name);
  return elems / static_cast<size_t>(t.block_elems) * static_cast<size_t>(t.block_bytes);
}

bool try_parse_safetensors_dtype(std::string_view name, DType* out) {
  for (const DTypeTraits& t : kTraits) {
    if (!t.safetensors.empty() && t.safetensors == name) {
      *out = t.dtype;
      return true;
    }
  }
  return false;
}

DType parse_dtype(std::string_view name) {
  for (const DTypeTraits& t : kTraits) {
    if (t.name == name || (!t.safetensors.empty() && t.safetensors == name)) return t.dtype;
  }
  std::string names;
  for (const DTypeTraits& t : kTraits) names += (names.empty() ? "" : ", ") + std::string(t.name);
  KILN_FAIL("unknown dtype '{}' (expected one of {})", name, names);
}

}  // namespace kiln
