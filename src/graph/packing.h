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
//
// "panel16q4" (target "avx512"): an i4 matrix [n, k] (core/dtype.h: two elements a byte) as panels
// of 16 rows (the last one w = min(16, n - 16p) rows), each row padded with zeros to k8 = k
// rounded up to a multiple of 8, a panel in blocks of 8 inputs: block b of panel p is the 4w bytes
// at byte 16p·k8/2 + 4w·b, whose byte 4j + u holds element (16p + j, 8b + u) in its low nibble and
// (16p + j, 8b + 4 + u) in its high nibble. A 64-byte line thus holds, in its low nibbles, 16
// outputs' weights for four consecutive inputs with each output's four side by side (the order
// vpdpbusd multiplies in), and in its high nibbles the next four: one load, a mask and a shift
// give two dot-product operands. Plans store it only for k a multiple of 8 (then exactly the
// plain bytes); a kernel packs other matrices itself. An i4 weight's group scales (f16 [n,
// groups]) are stored panel16: one panel's 16 scales of a group are 32 consecutive bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "graph/ir.h"

namespace kiln {

inline constexpr int64_t kPanelRows = 16;
inline constexpr const char* kPanel16 = "panel16";
inline constexpr const char* kPanel16Target = "avx512";

inline constexpr const char* kPanel16Q4 = "panel16q4";

inline WeightLayout panel16_layout() { return WeightLayout{kPanel16, kPanel16Target}; }
inline WeightLayout panel16q4_layout() { return WeightLayout{kPanel16Q4, kPanel16Target}; }

// Bytes of a panel16q4-packed i4 [n, k] matrix (n · k8 / 2).
inline int64_t panel16q4_bytes(int64_t n, int64_t k) { return n * ((k + 7) / 8 * 4); }

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
// Packs a row-major i4 [n, k] matrix (k even) into dst (panel16q4_bytes(n, k) bytes).
void pack_panel16q4(const void* src, void* dst, int64_t n, int64_t k);

// Empty when this kiln has kernels for the layout of a [dims...] weight of `dtype`; otherwise
// why not (an unknown packing, or one that does not apply to such a tensor).
std::string packed_layout_problem(const WeightLayout& layout, DType dtype, const Shape& shape);

}  // namespace kiln
