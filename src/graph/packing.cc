#include "graph/packing.h"

#include <cstring>

#include <fmt/format.h>

namespace kiln {
namespace {

template <bool kPack>
void permute_panel16(const char* src, char* dst, int64_t n, int64_t k, size_t e) {
  for (int64_t p0 = 0; p0 < n; p0 += kPanelRows) {
    const int64_t width = n - p0 < kPanelRows ? n - p0 : kPanelRows;
    for (int64_t r = 0; r < width; ++r)
      for (int64_t i = 0; i < k; ++i) {
        const size_t plain = static_cast<size_t>((p0 + r) * k + i) * e;
        const size_t packed = static_cast<size_t>(p0 * k + i * width + r) * e;
        if constexpr (kPack)
          std::memcpy(dst + packed, src + plain, e);
        else
          std::memcpy(dst + plain, src + packed, e);
      }
  }
}

}  // namespace

void pack_panel16(const void* src, void* dst, int64_t n, int64_t k, size_t elem_bytes) {
  permute_panel16<true>(static_cast<const char*>(src), static_cast<char*>(dst), n, k, elem_bytes);
}

void unpack_panel16(const void* src, void* dst, int64_t n, int64_t k, size_t elem_bytes) {
  permute_panel16<false>(static_cast<const char*>(src), static_cast<char*>(dst), n, k, elem_bytes);
}

void pack_panel16q4(const void* src, void* dst, int64_t n, int64_t k) {
  const auto* s = static_cast<const uint8_t*>(src);
  auto* d = static_cast<uint8_t*>(dst);
  const int64_t k8 = (k + 7) / 8 * 8;
  std::memset(d, 0, static_cast<size_t>(panel16q4_bytes(n, k)));
  auto nibble = [&](int64_t row, int64_t col) -> uint8_t {
    if (col >= k) return 0;
    const int64_t e = row * k + col;  // k is even: rows start on a byte
    return static_cast<uint8_t>((s[e / 2] >> (4 * (e % 2))) & 0xF);
  };
  for (int64_t p0 = 0; p0 < n; p0 += kPanelRows) {
    const int64_t width = n - p0 < kPanelRows ? n - p0 : kPanelRows;
    uint8_t* panel = d + p0 * k8 / 2;
    for (int64_t b = 0; b < k8 / 8; ++b)
      for (int64_t j = 0; j < width; ++j)
        for (int64_t u = 0; u < 4; ++u)
          panel[4 * width * b + 4 * j + u] =
              static_cast<uint8_t>(nibble(p0 + j, 8 * b + u) | nibble(p0 + j, 8 * b + 4 + u) << 4);
  }
}

std::string packed_layout_problem(const WeightLayout& layout, DType dtype, const Shape& shape) {
  if (layout.plain()) return {};
  if (layout.packing == kPanel16Q4 && layout.target == kPanel16Target) {
    if (dtype != DType::kI4)
      return fmt::format("a {} tensor cannot be packed as '{}' (i4 only)", dtype_name(dtype),
                         layout.packing);
    if (shape.size() != 2 || shape[1] % 8 != 0)
      return fmt::format("'{}' in a plan packs i4 matrices of a multiple of 8 columns, not {}",
                         layout.packing, shape_str(shape));
    return {};
  }
  if (layout.packing != kPanel16 || layout.target != kPanel16Target)
    return fmt::format("weights packed as '{}' for {}, a layout this kiln has no kernel for",
                       layout.packing, layout.target);
  switch (dtype) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kI8:
      break;
    case DType::kI32:
    case DType::kI64:
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kI4:
      return fmt::format("a {} tensor cannot be packed as '{}' (f32, f16, bf16 or i8 only)",
                         dtype_name(dtype), layout.packing);
  }
  if (shape.size() != 2)
    return fmt::format("'{}' packs matrices, not a tensor of {} dimensions", layout.packing,
                       shape.size());
  return {};
}

}  // namespace kiln
