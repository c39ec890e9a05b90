// Ops that give the same elements another shape (Reshape, Flatten, Squeeze, Unsqueeze: views
// of their input) or repeat them (Expand).
#include <set>

#include "frontend/onnx/interp/kernel_util.h"
#include "frontend/onnx/interp/kernels.h"

namespace kiln {
namespace {

// Output 0 is a view of input 0 with `shape` (nothing is allocated or copied).
void view_input(OpContext& ctx, Shape shape) {
  if (ctx.shape_only())
    ctx.set_output(0, ctx.input_type(0), std::move(shape));
  else
    ctx.set_output(0, ctx.input(0).reshaped(std::move(shape)));
}

int64_t product(const Shape& s, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t i = begin; i < end; ++i) n *= s[i];
  return n;
}

}  // namespace

// Reshape(data, shape): 0 copies the input's dimension at that index (unless allowzero, opset
// 14+, makes it a real 0), one -1 is inferred from the element count.
void run_reshape(OpContext& ctx) {
  const Shape& in = ctx.input_shape(0);
  const std::vector<int64_t> spec = ctx.input_ints(1, "shape");
  const bool allow_zero = ctx.opset() >= 14 && ctx.attr_int("allowzero", 0) != 0;
  Shape out(spec.size());
  int inferred = -1;
  for (size_t i = 0; i < spec.size(); ++i) {
    const int64_t d = spec[i];
    if (d == -1) {
      KILN_CHECK(inferred < 0, "shape {} has more than one -1", shape_str(spec));
      inferred = static_cast<int>(i);
      out[i] = 1;
    } else if (d == 0 && !allow_zero) {
      KILN_CHECK(i < in.size(), "shape {}: 0 at index {} copies a dimension the input {} has not",
                 shape_str(spec), i, shape_str(in));
      out[i] = in[i];
    } else {
      KILN_CHECK(d >= 0, "shape {} has a negative dimension {}", shape_str(spec), d);
      out[i] = d;
    }
  }
  KILN_CHECK(!(allow_zero && inferred >= 0 && std::count(spec.begin(), spec.end(), 0) > 0),
             "shape {} has both 0 and -1 with allowzero", shape_str(spec));
  const int64_t total = shape_numel(in);
  if (inferred >= 0) {
    const int64_t known = shape_numel(out);
    KILN_CHECK(known != 0 && total % known == 0,
               "cannot reshape {} ({} elements) to {}: no size for the -1 dimension fits",
               shape_str(in), total, shape_str(spec));
    out[inferred] = total / known;
  }
  KILN_CHECK(shape_numel(out) == total, "cannot reshape {} ({} elements) to {} ({} elements)",
             shape_str(in), total, shape_str(out), shape_numel(out));
  view_input(ctx, std::move(out));
}

// Flatten(x): [prod(x.shape[:axis]), prod(x.shape[axis:])], axis in [-rank, rank].
void run_flatten(OpContext& ctx) {
  const Shape& in = ctx.input_shape(0);
  const int rank = static_cast<int>(in.size());
  int64_t axis = ctx.attr_int("axis", 1);
  KILN_CHECK(axis >= -rank && axis <= rank, "Flatten's axis {} is out of range for rank {}", axis,
             rank);
  if (axis < 0) axis += rank;
  view_input(ctx, {product(in, 0, axis), product(in, axis, in.size())});
}

// Squeeze(data[, axes]) (axes an input since opset 13): drops the given dimensions, which must be
// 1, or every dimension of size 1.
void run_squeeze(OpContext& ctx) {
  const Shape& in = ctx.input_shape(0);
  const int rank = static_cast<int>(in.size());
  std::vector<bool> drop(rank, false);
  if (ctx.has_input(1)) {
    for (int64_t a : ctx.input_ints(1, "axes")) {
      const int axis = normalize_axis(a, rank, "Squeeze axis");
      KILN_CHECK(in[axis] == 1, "cannot squeeze dimension {} of {}: it is {}, not 1", a,
                 shape_str(in), in[axis]);
      drop[axis] = true;
    }
  } else {
    for (int d = 0; d < rank; ++d) drop[d] = in[d] == 1;
  }
  Shape out;
  for (int d = 0; d < rank; ++d)
    if (!drop[d]) out.push_back(in[d]);
  view_input(ctx, std::move(out));
}

// Unsqueeze(data, axes) (axes an input since opset 13): inserts dimensions of size 1 at the given
// positions of the output (each in [-out_rank, out_rank), no repeats).
void run_unsqueeze(OpContext& ctx) {
  const Shape& in = ctx.input_shape(0);
  KILN_CHECK(ctx.has_input(1), "Unsqueeze needs its axes input (opset 13+)");
  const std::vector<int64_t> axes = ctx.input_ints(1, "axes");
  const int out_rank = static_cast<int>(in.size() + axes.size());
  std::vector<bool> inserted(out_rank, false);
  for (int64_t a : axes) {
    const int axis = normalize_axis(a, out_rank, "Unsqueeze axis");
    KILN_CHECK(!inserted[axis], "Unsqueeze axes {} name dimension {} twice", shape_str(axes), axis);
    inserted[axis] = true;
  }
  Shape out;
  size_t next = 0;
  for (int d = 0; d < out_rank; ++d) out.push_back(inserted[d] ? 1 : in[next++]);
  view_input(ctx, std::move(out));
}

// Expand(input, shape): input broadcast with `shape` (both ways: a 1 in `shape` keeps the input's
// dimension).
void run_expand(OpContext& ctx) {
  const Shape& in = ctx.input_shape(0);
  const std::vector<int64_t> spec = ctx.input_ints(1, "shape");
  const Shape out = broadcast_shapes({in, spec});
  ImportTensor& y = ctx.set_output(0, ctx.input_type(0), out);
  if (ctx.shape_only()) return;
  const ImportTensor& x = ctx.input(0);
  const std::array<Shape, 1> strides = {broadcast_strides(in, out)};
  visit_element_bytes(x.element_bytes(), [&](auto tag) {
    using E = decltype(tag);
    const E* src = static_cast<const E*>(x.raw());
    E* dst = static_cast<E*>(y.mutable_raw());
    for_each_row<1>(out, strides, [&](int64_t o, const auto& off, const auto& step, int64_t n) {
      for (int64_t j = 0; j < n; ++j) dst[o + j] = src[off[0] + j * step[0]];
    });
  });
}

}  // namespace kiln
