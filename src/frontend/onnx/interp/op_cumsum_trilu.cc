// CumSum (running sums along one axis, exclusive and/or reversed) and Trilu (the upper or lower
// triangle of the last two dimensions, shifted by k; the rest zero).
#include <cstring>

#include "frontend/onnx/interp/kernel_util.h"
#include "frontend/onnx/interp/kernels.h"

namespace kiln {
namespace {

int64_t product(const Shape& s, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t i = begin; i < end; ++i) n *= s[i];
  return n;
}

}  // namespace

// CumSum(x, axis): y[i] = x[0] + ... + x[i] along the axis; exclusive leaves x[i] out,
// reverse sums from the end.
void run_cumsum(OpContext& ctx) {
  const OnnxElemType type = ctx.input_type(0);
  const Shape& in = ctx.input_shape(0);
  const int rank = static_cast<int>(in.size());
  ImportTensor& y = ctx.set_output(0, type, in);
  if (ctx.shape_only()) return;
  const int axis = normalize_axis(scalar_int64(ctx.input(1), "CumSum's axis"), rank, "CumSum axis");
  const bool exclusive = ctx.attr_int("exclusive", 0) != 0;
  const bool reverse = ctx.attr_int("reverse", 0) != 0;
  const int64_t outer = product(in, 0, axis), dim = in[axis], inner = product(in, axis + 1, rank);
  visit_numeric(type, "CumSum", [&](auto tag) {
    using T = decltype(tag);
    const T* px = ctx.input(0).data<T>();
    T* py = y.mutable_data<T>();
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i) {
        T sum{0};
        for (int64_t s = 0; s < dim; ++s) {
          const int64_t d = reverse ? dim - 1 - s : s;
          const int64_t at = (o * dim + d) * inner + i;
          if (exclusive) {
            py[at] = sum;
            sum = wrap_add(sum, px[at]);
          } else {
            sum = wrap_add(sum, px[at]);
            py[at] = sum;
          }
        }
      }
  });
}

// Trilu(input[, k]): upper (default) keeps elements with column - row >= k, lower those with
// column - row <= k, over the last two dimensions.
void run_trilu(OpContext& ctx) {
  const Shape& in = ctx.input_shape(0);
  const int rank = static_cast<int>(in.size());
  KILN_CHECK(rank >= 2, "Trilu needs a tensor of rank 2 or more, got {}", shape_str(in));
  ImportTensor& y = ctx.set_output(0, ctx.input_type(0), in);
  if (ctx.shape_only()) return;
  const int64_t k = ctx.has_input(1) ? scalar_int64(ctx.input(1), "Trilu's k") : 0;
  const bool upper = ctx.attr_int("upper", 1) != 0;
  const ImportTensor& x = ctx.input(0);
  const int64_t rows = in[rank - 2], cols = in[rank - 1];
  const int64_t matrices = product(in, 0, rank - 2);
  const auto elem = static_cast<int64_t>(x.element_bytes());
  const auto* src = static_cast<const char*>(x.raw());
  auto* dst = static_cast<char*>(y.mutable_raw());  // zero-filled
  for (int64_t m = 0; m < matrices; ++m)
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) {
        // c - r cannot overflow; comparing with an extreme k is then exact.
        const bool keep = upper ? c - r >= k : c - r <= k;
        if (!keep) continue;
        const int64_t at = ((m * rows + r) * cols + c) * elem;
        std::memcpy(dst + at, src + at, elem);
      }
}

}  // namespace kiln
