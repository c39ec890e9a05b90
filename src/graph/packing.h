// Weight layouts packed for a kernel: the byte order of each one, shared by the build pass that
// packs weights, the plan reader that accepts them and the kernels that read them.
//
// "panel16" (target "avx512"): a matrix [n, k] (Linear weight [out, in]) as panels of 16 rows,
// each stored column by column: panel p holds rows 16p .. 16p+w-1 (w = min(16, n - 16p)) and
// element (16p + r, i) sits at 16p*k + i*w + r. One 64-byte load then brings 16 outputs' weights
// for one input element (f32; 32 bytes for bf16/f16, 16 for i8), which an AVX-512 kernel
// multiplies by a broadcast activation: every output is one fused-multiply-add chain over i
// whatever the number of rows, and each weight load serves every row of a tile. The last panel
// of an n that is not a multiple of 16 is narrower (w < 16), so a packed matrix has exactly the
// bytes of the plain one (the plan's blob size checks stay the same).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "graph/ir.h"

namespace kiln {

inline constexpr int64_t kPanelRows = 16;
inline constexpr const char* kPanel16 = "panel16";
inline constexpr const char* kPanel16Target = "avx512";

inline WeightLayout panel16_layout() { return WeightLayout{kPanel16, kPanel16Target}; }

// Offset, in elements, of element (row, col) of a panel16-packed [n, k] matrix.
inline int64_t panel16_offset(int64_t n, int64_t k, int64_t row, int64_t col) {
  const int64_t p0 = row / kPanelRows * kPanelRows;
  const int64_t width = n - p0 < kPanelRows ? n - p0 : kPanelRows;
  return p0 * k + col * width + (row - p0);
}

// Packs a row-major [n, k] matrix of `elem_bytes`-byte elements into dst (the same bytes).
void pack_panel16(const void* src, void* dst, int64_t n, int64_t k, size_t elem_bytes);
// The row-major matrix back from its panel16 form.
void unpack_panel16(const void* src, void* dst, int64_t n, int64_t k, size_t elem_bytes);

// Empty when this kiln has kernels for the layout of a [dims...] weight of `dtype`; otherwise
// why not (an unknown packing, or one that does not apply to such a tensor).
std::string packed_layout_problem(const WeightLayout& layout, DType dtype, const Shape& shape);

}  // namespace kiln
