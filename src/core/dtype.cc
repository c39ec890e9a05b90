#include "core/dtype.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>

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

struct Q8Block {
  uint16_t scale;  // fp16
  int8_t q[32];
};
static_assert(sizeof(Q8Block) == 34, "q8_b32 blocks are 34 bytes");

void q8_to_float(const void* src, float* dst, size_t n) {
  const auto* blocks = static_cast<const unsigned char*>(src);
  for (size_t b = 0; b < n / 32; ++b) {
    Q8Block blk;
    std::memcpy(&blk, blocks + b * 34, 34);  // blocks are not 2-byte aligned in an array
    const float scale = fp16_to_float(blk.scale);
    for (int i = 0; i < 32; ++i) dst[b * 32 + i] = static_cast<float>(blk.q[i]) * scale;
  }
}
void q8_from_float(const float* src, void* dst, size_t n) {
  auto* blocks = static_cast<unsigned char*>(dst);
  for (size_t b = 0; b < n / 32; ++b) {
    const float* x = src + b * 32;
    float amax = 0.0f;
    for (int i = 0; i < 32; ++i) amax = std::max(amax, std::fabs(x[i]));
    Q8Block blk;
    blk.scale = float_to_fp16(amax / 127.0f);
    // Quantize with the scale as stored (rounded to fp16), so dequantizing reproduces it.
    const float scale = fp16_to_float(blk.scale);
    const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    for (int i = 0; i < 32; ++i)
      blk.q[i] = static_cast<int8_t>(std::clamp(std::nearbyint(x[i] * inv), -127.0f, 127.0f));
    std::memcpy(blocks + b * 34, &blk, 34);
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
    {DType::kQ8B32, "q8_b32", "", 32, 34, true, q8_to_float, q8_from_float},
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
  KILN_FAIL("unknown dtype '{}' (expected one of f32, f16, bf16, i8, i32, i64, q8_b32)", name);
}

}  // namespace kiln
