// Weight quantization for the precision pass: the values a quantized matrix stores, from its f32
// values. Two formats (graph/linear.h defines what kernels compute from them):
// - i8 per row (int8-weight, int8 plans, and int4-weight plans' Embedding tables and logits):
//   scale = max|row| / 127, q = round(w / scale) in [-127, 127], f32 scales [rows].
// - f8_e4m3 per row (fp8 plans' Linears): scale = max|row| / 448, q = E4M3(w / scale) (rounded
//   to nearest even, core/fp8.h), f32 scales [rows]; a row of zeros stores scale 0 and q = 0.
// - i4 per group of kInt4Group inputs (int4-weight plans' Linears), symmetric, f16 scales
//   [rows, int4_groups(cols)]: for each group, m = its element of largest magnitude (the first
//   one on a tie), scale = f16(m / -8), q = round(w / scale) (ties to even) clamped to [-8, 7].
//   m itself becomes -8 (exact up to the scale's f16 rounding): the 16 levels reach both ends of
//   the group's range, a step of max|w| / 8 (ggml's Q4_0 uses the same choice), and a value of
//   the opposite sign at the same magnitude clamps to 7 (one step off, where elsewhere an error
//   is at most half a step). A group of zeros stores scale +0 and q = 0; one whose scale f16
//   rounds to zero stores q = 0 with that scale.
#pragma once

#include <cstdint>
#include <string>

#include "core/tensor.h"

namespace kiln {

// w [rows, cols] f32 -> q i8 [rows, cols], scales f32 [rows].
void quantize_rows_int8(const Tensor& w, Tensor* q, Tensor* scales);
// w [rows, cols] f32 -> q f8_e4m3 [rows, cols], scales f32 [rows].
void quantize_rows_fp8(const Tensor& w, Tensor* q, Tensor* scales);
// One row of quantize_groups_int4: q [cols] in [-8, 7] and the f16 bits of each group's scale
// [int4_groups(cols)] (AWQ's search quantizes rows one at a time, passes/awq.h).
void quantize_row_int4(const float* row, int64_t cols, int8_t* q, uint16_t* scale_bits);
void fake_quantize_row_int4(const float* row, int64_t cols, float* out);
// w [rows, cols] f32 (cols even) -> q i4 [rows, cols], scales f16 [rows, int4_groups(cols)].
void quantize_groups_int4(const Tensor& w, Tensor* q, Tensor* scales);
// q i4 [rows, cols] and its f16 group scales -> w [rows, cols] f32 (the definition).
Tensor dequantize_groups_int4(const Tensor& q, const Tensor& scales);
// Why an f32 matrix [rows, cols] cannot be stored as i4 with f16 group scales (an odd `cols`; a
// scale beyond f16's range); empty when it can.
std::string int4_refused(const Tensor& w);

}  // namespace kiln
