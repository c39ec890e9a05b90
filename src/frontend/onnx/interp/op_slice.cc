// Slice(data, starts, ends[, axes[, steps]]) (inputs since opset 10): per axis, elements start,
// start + step, ... up to but excluding end, with ONNX's clamping (negative indices count from the
// end; out-of-range indices are clamped, to [0, dim] for positive steps and [-1, dim - 1] for
// negative ones).
#include "frontend/onnx/interp/kernel_util.h"
#include "frontend/onnx/interp/kernels.h"

namespace kiln {

void run_slice(OpContext& ctx) {
  const Shape& in = ctx.input_shape(0);
  const int rank = static_cast<int>(in.size());
  const std::vector<int64_t> starts = ctx.input_ints(1, "starts");
  const std::vector<int64_t> ends = ctx.input_ints(2, "ends");
  const size_t n = starts.size();
  KILN_CHECK(ends.size() == n, "Slice has {} starts and {} ends", n, ends.size());
  std::vector<int64_t> axes, steps(n, 1);
  if (ctx.has_input(3)) {
    axes = ctx.input_ints(3, "axes");
    KILN_CHECK(axes.size() == n, "Slice has {} starts and {} axes", n, axes.size());
  } else {
    for (size_t i = 0; i < n; ++i) axes.push_back(static_cast<int64_t>(i));
  }
  if (ctx.has_input(4)) {
    steps = ctx.input_ints(4, "steps");
    KILN_CHECK(steps.size() == n, "Slice has {} starts and {} steps", n, steps.size());
  }
  Shape out = in;
  std::vector<int64_t> first(rank, 0), step(rank, 1);
  std::vector<bool> seen(rank, false);
  for (size_t i = 0; i < n; ++i) {
    const int axis = normalize_axis(axes[i], rank, "Slice axis");
    KILN_CHECK(!seen[axis], "Slice axes {} name axis {} twice", shape_str(axes), axis);
    seen[axis] = true;
    KILN_CHECK(steps[i] != 0, "Slice step for axis {} is 0", axis);
    const int64_t dim = in[axis];
    int64_t s = starts[i], e = ends[i];
    if (s < 0) s += dim;
    if (e < 0) e += dim;
    int64_t count;
    if (steps[i] > 0) {
      s = std::clamp<int64_t>(s, 0, dim);
      e = std::clamp<int64_t>(e, 0, dim);
      count = e > s ? (e - s - 1) / steps[i] + 1 : 0;
    } else if (dim == 0) {
      count = 0;
    } else {
      s = std::clamp<int64_t>(s, 0, dim - 1);
      e = std::clamp<int64_t>(e, -1, dim - 1);
      // -steps[i] could overflow for INT64_MIN: count from the magnitude as unsigned.
      const auto mag = static_cast<uint64_t>(-(steps[i] + 1)) + 1;
      count = s > e ? static_cast<int64_t>(static_cast<uint64_t>(s - e - 1) / mag) + 1 : 0;
    }
    out[axis] = count;
    first[axis] = s;
    step[axis] = steps[i];
  }
  ImportTensor& y = ctx.set_output(0, ctx.input_type(0), out);
  if (ctx.shape_only() || y.numel() == 0) return;
  const ImportTensor& x = ctx.input(0);
  const Shape own = row_major_strides(in);
  std::array<Shape, 1> strides = {Shape(rank)};
  int64_t base = 0;
  for (int d = 0; d < rank; ++d) {
    // Outputs have at least one element along every axis here: the steps only matter with
    // count > 1, where |step| < dim, so these products stay in range.
    strides[0][d] = out[d] > 1 ? own[d] * step[d] : 0;
    base += first[d] * own[d];
  }
  visit_element_bytes(x.element_bytes(), [&](auto tag) {
    using E = decltype(tag);
    const E* src = static_cast<const E*>(x.raw()) + base;
    E* dst = static_cast<E*>(y.mutable_raw());
    for_each_row<1>(out, strides, [&](int64_t o, const auto& off, const auto& st, int64_t len) {
      for (int64_t j = 0; j < len; ++j) dst[o + j] = src[off[0] + j * st[0]];
    });
  });
}

}  // namespace kiln
