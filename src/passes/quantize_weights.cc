#include "passes/quantize_weights.h"

#include "core/f32_chunks.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include <fmt/format.h>

#include "core/half.h"
#include "graph/linear.h"

namespace kiln {

void quantize_rows_int8(const Tensor& w, Tensor* q, Tensor* scales) {
  const int64_t rows = w.dim(0), cols = w.dim(1);
  *q = Tensor::empty(DType::kI8, w.shape());
  *scales = Tensor::empty(DType::kF32, {rows});
  const float* src = w.data<float>();
  int8_t* dst = q->data<int8_t>();
  float* s = scales->data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = src + r * cols;
    float amax = 0.0f;
    for (int64_t i = 0; i < cols; ++i) amax = std::max(amax, std::fabs(row[i]));
    const float scale = amax / 127.0f;
    const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    for (int64_t i = 0; i < cols; ++i)
      dst[r * cols + i] =
          static_cast<int8_t>(std::clamp(std::nearbyint(row[i] * inv), -127.0f, 127.0f));
    s[r] = scale;
  }
}

void quantize_rows_fp8(const Tensor& w, Tensor* q, Tensor* scales) {
  const int64_t rows = w.dim(0), cols = w.dim(1);
  *q = Tensor::empty(DType::kF8E4M3, w.shape());
  *scales = Tensor::empty(DType::kF32, {rows});
  const float* src = w.data<float>();
  auto* dst = static_cast<uint8_t*>(q->raw());
  float* s = scales->data<float>();
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = src + r * cols;
    float amax = 0.0f;
    for (int64_t i = 0; i < cols; ++i) amax = std::max(amax, std::fabs(row[i]));
    const float scale = amax / kFp8Max;
    const float inv = scale > 0.0f ? 1.0f / scale : 0.0f;
    for (int64_t i = 0; i < cols; ++i) dst[r * cols + i] = float_to_fp8_e4m3(row[i] * inv);
    s[r] = scale;
  }
}

void quantize_row_int4(const float* row, int64_t cols, int8_t* q, uint16_t* scale_bits) {
  for (int64_t g = 0; g < int4_groups(cols); ++g) {
    const int64_t i0 = g * kInt4Group, i1 = std::min(cols, i0 + kInt4Group);
    float m = 0.0f;
    for (int64_t i = i0; i < i1; ++i)
      if (std::fabs(row[i]) > std::fabs(m)) m = row[i];
    const uint16_t bits = m == 0.0f ? uint16_t{0} : float_to_fp16(m / -8.0f);  // not -0
    const float scale = fp16_to_float(bits);
    const float inv = scale != 0.0f ? 1.0f / scale : 0.0f;
    scale_bits[g] = bits;
    for (int64_t i = i0; i < i1; ++i)
      q[i] = static_cast<int8_t>(std::clamp(std::nearbyint(row[i] * inv), -8.0f, 7.0f));
  }
}

void quantize_groups_int4(const Tensor& w, Tensor* q, Tensor* scales) {
  const int64_t rows = w.dim(0), cols = w.dim(1), groups = int4_groups(cols);
  KILN_CHECK(cols % 2 == 0, "int4 weights need an even number of columns, not {}", cols);
  *q = Tensor::empty(DType::kI4, w.shape());
  *scales = Tensor::empty(DType::kF16, {rows, groups});
  const float* src = w.data<float>();
  auto* dst = static_cast<uint8_t*>(q->raw());
  auto* s = static_cast<uint16_t*>(scales->raw());
  std::vector<int8_t> values(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    quantize_row_int4(src + r * cols, cols, values.data(), s + r * groups);
    for (int64_t i = 0; i < cols; i += 2)  // cols is even: rows start on a byte
      dst[(r * cols + i) / 2] =
          static_cast<uint8_t>((values[i] & 0xF) | ((values[i + 1] & 0xF) << 4));
  }
}

Tensor dequantize_groups_int4(const Tensor& q, const Tensor& scales) {
  KILN_CHECK(q.dtype() == DType::kI4 && q.rank() == 2 && scales.dtype() == DType::kF16 &&
                 scales.rank() == 2 && scales.dim(0) == q.dim(0) &&
                 scales.dim(1) == int4_groups(q.dim(1)),
             "dequantize_groups_int4: an i4 [rows, cols] weight and f16 [rows, groups] scales, "
             "not {} {} and {} {}",
             dtype_name(q.dtype()), shape_str(q.shape()), dtype_name(scales.dtype()),
             shape_str(scales.shape()));
  const int64_t rows = q.dim(0), cols = q.dim(1), groups = scales.dim(1);
  Tensor w = q.to_f32();
  const auto* s = static_cast<const uint16_t*>(scales.raw());
  float* v = w.data<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t i = 0; i < cols; ++i)
      v[r * cols + i] *= fp16_to_float(s[r * groups + i / kInt4Group]);
  return w;
}

std::string int4_refused(const Tensor& w) {
  if (w.rank() != 2) return fmt::format("i4 weights are matrices, not {} dimensions", w.rank());
  if (w.dim(1) % 2 != 0)
    return fmt::format("its {} inputs are odd, and i4 rows pack two elements a byte", w.dim(1));
  // Any float type (a CUDA plan keeps a checkpoint's f16 weights narrow until they are quantized).
  const Tensor c = w.is_contiguous() ? w : w.clone();
  float amax = 0.0f;
  for_each_f32_chunk(c, size_t{1} << 20, [&](const float* v, size_t, size_t n) {
    for (size_t i = 0; i < n; ++i) amax = std::max(amax, std::fabs(v[i]));
    return true;
  });
  if (amax / 8.0f > 65504.0f)
    return fmt::format("max |w| = {:g} needs a group scale beyond fp16's largest value 65504",
                       amax);
  return {};
}

}  // namespace kiln
