// Ops that rearrange elements along axes: Transpose, Concat, Split.
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

// Transpose(x): output dimension i is input dimension perm[i] (default: reversed).
void run_transpose(OpContext& ctx) {
  const Shape& in = ctx.input_shape(0);
  const int rank = static_cast<int>(in.size());
  std::vector<int64_t> perm = ctx.attr_ints("perm");
  if (!ctx.has_attr("perm"))
    for (int d = rank - 1; d >= 0; --d) perm.push_back(d);
  KILN_CHECK(static_cast<int>(perm.size()) == rank,
             "Transpose's perm {} has {} entries for an input of rank {}", shape_str(perm),
             perm.size(), rank);
  std::vector<bool> seen(rank, false);
  Shape out(rank);
  for (int d = 0; d < rank; ++d) {
    KILN_CHECK(perm[d] >= 0 && perm[d] < rank && !seen[perm[d]],
               "Transpose's perm {} is not a permutation of 0..{}", shape_str(perm), rank - 1);
    seen[perm[d]] = true;
    out[d] = in[perm[d]];
  }
  ImportTensor& y = ctx.set_output(0, ctx.input_type(0), out);
  if (ctx.shape_only()) return;
  const ImportTensor& x = ctx.input(0);
  const Shape own = row_major_strides(in);
  std::array<Shape, 1> strides = {Shape(rank)};
  for (int d = 0; d < rank; ++d) strides[0][d] = own[perm[d]];
  visit_element_bytes(x.element_bytes(), [&](auto tag) {
    using E = decltype(tag);
    const E* src = static_cast<const E*>(x.raw());
    E* dst = static_cast<E*>(y.mutable_raw());
    for_each_row<1>(out, strides, [&](int64_t o, const auto& off, const auto& step, int64_t n) {
      for (int64_t j = 0; j < n; ++j) dst[o + j] = src[off[0] + j * step[0]];
    });
  });
}

// Concat(inputs...): along `axis`; every other dimension equal.
void run_concat(OpContext& ctx) {
  KILN_CHECK(ctx.input_count() >= 1, "Concat needs at least one input");
  KILN_CHECK(ctx.has_attr("axis"), "Concat needs the attribute 'axis'");
  const OnnxElemType type = ctx.input_type(0);
  const Shape& first = ctx.input_shape(0);
  const int rank = static_cast<int>(first.size());
  const int axis = normalize_axis(ctx.attr_int("axis", 0), rank, "Concat axis");
  Shape out = first;
  out[axis] = 0;
  for (int i = 0; i < ctx.input_count(); ++i) {
    const Shape& s = ctx.input_shape(i);
    KILN_CHECK(ctx.input_type(i) == type, "Concat's inputs have different types: {} and {}",
               onnx_elem_type_name(type), onnx_elem_type_name(ctx.input_type(i)));
    bool same = static_cast<int>(s.size()) == rank;
    for (int d = 0; same && d < rank; ++d) same = d == axis || s[d] == first[d];
    KILN_CHECK(same, "Concat along axis {}: input {} has shape {}, input 0 {}", axis, i,
               shape_str(s), shape_str(first));
    out[axis] += s[axis];
  }
  ImportTensor& y = ctx.set_output(0, type, out);
  if (ctx.shape_only()) return;
  const int64_t outer = product(out, 0, axis);
  const size_t elem = y.element_bytes();
  const int64_t out_row = product(out, axis, rank) * static_cast<int64_t>(elem);
  int64_t at = 0;  // bytes into each output row
  for (int i = 0; i < ctx.input_count(); ++i) {
    const ImportTensor& x = ctx.input(i);
    const int64_t row = product(x.shape(), axis, rank) * static_cast<int64_t>(elem);
    const auto* src = static_cast<const char*>(x.raw());
    auto* dst = static_cast<char*>(y.mutable_raw());
    for (int64_t o = 0; o < outer; ++o) std::memcpy(dst + o * out_row + at, src + o * row, row);
    at += row;
  }
}

// Split(input[, split]) along `axis`: sizes from the split input (opset 13+), else
// num_outputs (opset 18: ceil(dim / n) each, the last smaller), else equal parts, one per output.
void run_split(OpContext& ctx) {
  const Shape& in = ctx.input_shape(0);
  const int rank = static_cast<int>(in.size());
  const int axis = normalize_axis(ctx.attr_int("axis", 0), rank, "Split axis");
  const int outputs = ctx.output_count();
  const int64_t dim = in[axis];
  std::vector<int64_t> sizes;
  if (ctx.has_input(1)) {
    sizes = ctx.input_ints(1, "split");
    int64_t sum = 0;
    for (int64_t s : sizes) {
      KILN_CHECK(s >= 0, "Split sizes {} have a negative entry", shape_str(sizes));
      sum += s;
    }
    KILN_CHECK(sum == dim && static_cast<int>(sizes.size()) == outputs,
               "Split sizes {} must sum to dimension {} ({}) with one size per output ({})",
               shape_str(sizes), axis, dim, outputs);
  } else if (ctx.opset() >= 18 && ctx.has_attr("num_outputs")) {
    const int64_t n = ctx.attr_int("num_outputs", 0);
    KILN_CHECK(n == outputs && n > 0, "Split's num_outputs {} does not match its {} outputs", n,
               outputs);
    const int64_t chunk = (dim + n - 1) / n;
    for (int64_t i = 0, left = dim; i < n; ++i, left -= std::min(chunk, left))
      sizes.push_back(std::min(chunk, left));
  } else {
    KILN_CHECK(outputs > 0 && dim % outputs == 0,
               "Split without sizes: dimension {} ({}) does not divide into {} equal parts", axis,
               dim, outputs);
    sizes.assign(outputs, dim / outputs);
  }
  const int64_t outer = product(in, 0, axis);
  const int64_t inner = product(in, axis + 1, rank);
  const OnnxElemType type = ctx.input_type(0);
  for (int i = 0; i < outputs; ++i) {
    Shape s = in;
    s[axis] = sizes[i];
    ctx.set_output(i, type, s);
  }
  if (ctx.shape_only()) return;
  const ImportTensor& x = ctx.input(0);
  const auto elem = static_cast<int64_t>(x.element_bytes());
  const auto* src = static_cast<const char*>(x.raw());
  int64_t at = 0;  // elements into each input row of dim * inner
  for (int i = 0; i < outputs; ++i) {
    auto* dst = static_cast<char*>(ctx.outputs()[i].mutable_raw());
    const int64_t part = sizes[i] * inner;
    for (int64_t o = 0; o < outer; ++o)
      std::memcpy(dst + o * part * elem, src + (o * dim * inner + at) * elem, part * elem);
    at += part;
  }
}

}  // namespace kiln
