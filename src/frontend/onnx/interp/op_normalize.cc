// Ops that normalize or reduce along axes: Softmax (opset 13: one axis), LayerNormalization
// (opset 17: the trailing dimensions from `axis`), ReduceMean (axes an attribute through opset
// 17, an input from opset 18) and ReduceSum (an input from opset 13). Sums accumulate in double.
#include <cmath>
#include <set>

#include "frontend/onnx/interp/kernel_util.h"
#include "frontend/onnx/interp/kernels.h"

namespace kiln {
namespace {

int64_t product(const Shape& s, size_t begin, size_t end) {
  int64_t n = 1;
  for (size_t i = begin; i < end; ++i) n *= s[i];
  return n;
}

void check_float(const OpContext& ctx, int input, std::string_view op) {
  KILN_CHECK(ctx.input_type(input) == OnnxElemType::kFloat, "{} takes float tensors, got {}", op,
             onnx_elem_type_name(ctx.input_type(input)));
}

}  // namespace

// Softmax(x) along `axis` (default -1): exp(x - max) / sum.
void run_softmax(OpContext& ctx) {
  check_float(ctx, 0, "Softmax");
  const Shape& in = ctx.input_shape(0);
  const int rank = static_cast<int>(in.size());
  const int axis = normalize_axis(ctx.attr_int("axis", -1), rank, "Softmax axis");
  ImportTensor& y = ctx.set_output(0, OnnxElemType::kFloat, in);
  if (ctx.shape_only()) return;
  const float* x = ctx.input(0).data<float>();
  float* out = y.mutable_data<float>();
  const int64_t outer = product(in, 0, axis), dim = in[axis], inner = product(in, axis + 1, rank);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i) {
      const float* px = x + o * dim * inner + i;
      float* py = out + o * dim * inner + i;
      float mx = -INFINITY;
      for (int64_t d = 0; d < dim; ++d) mx = std::max(mx, px[d * inner]);
      double sum = 0;
      for (int64_t d = 0; d < dim; ++d) {
        py[d * inner] = std::exp(px[d * inner] - mx);
        sum += py[d * inner];
      }
      for (int64_t d = 0; d < dim; ++d) py[d * inner] = static_cast<float>(py[d * inner] / sum);
    }
}

// LayerNormalization(X, Scale[, B]) -> Y[, Mean, InvStdDev]: each row of the dimensions from
// `axis` on is normalized (mean 0, variance 1 with epsilon), then scaled and shifted; Scale and B
// broadcast to those dimensions.
void run_layer_normalization(OpContext& ctx) {
  check_float(ctx, 0, "LayerNormalization");
  const Shape& in = ctx.input_shape(0);
  const int rank = static_cast<int>(in.size());
  const int axis = normalize_axis(ctx.attr_int("axis", -1), rank, "LayerNormalization axis");
  const float epsilon = ctx.attr_float("epsilon", 1e-5f);
  const Shape norm(in.begin() + axis, in.end());
  for (int i = 1; i < 3; ++i) {
    if (!ctx.has_input(i)) continue;
    check_float(ctx, i, "LayerNormalization");
    const Shape& s = ctx.input_shape(i);
    KILN_CHECK(broadcasts_to(s, norm),
               "LayerNormalization's {} {} does not broadcast to the normalized shape {}",
               i == 1 ? "Scale" : "B", shape_str(s), shape_str(norm));
  }
  KILN_CHECK(ctx.has_input(1), "LayerNormalization needs Scale");
  Shape stat_shape(in.begin(), in.begin() + axis);
  stat_shape.resize(rank, 1);
  ImportTensor& y = ctx.set_output(0, OnnxElemType::kFloat, in);
  const bool want_mean = ctx.output_count() > 1 && ctx.node().outputs[1] >= 0;
  const bool want_inv = ctx.output_count() > 2 && ctx.node().outputs[2] >= 0;
  if (want_mean) ctx.set_output(1, OnnxElemType::kFloat, stat_shape);
  if (want_inv) ctx.set_output(2, OnnxElemType::kFloat, stat_shape);
  if (ctx.shape_only()) return;
  const float* x = ctx.input(0).data<float>();
  const int64_t rows = product(in, 0, axis), cols = product(in, axis, rank);
  // Scale and B expanded to the normalized shape once.
  auto expand = [&](int i, float fill) {
    std::vector<float> v(static_cast<size_t>(cols), fill);
    if (!ctx.has_input(i)) return v;
    const ImportTensor& t = ctx.input(i);
    const float* src = t.data<float>();
    const std::array<Shape, 1> strides = {broadcast_strides(t.shape(), norm)};
    for_each_row<1>(norm, strides, [&](int64_t o, const auto& off, const auto& step, int64_t n) {
      for (int64_t j = 0; j < n; ++j) v[o + j] = src[off[0] + j * step[0]];
    });
    return v;
  };
  const std::vector<float> scale = expand(1, 1.0f), bias = expand(2, 0.0f);
  float* out = y.mutable_data<float>();
  float* mean_out = want_mean ? ctx.outputs()[1].mutable_data<float>() : nullptr;
  float* inv_out = want_inv ? ctx.outputs()[2].mutable_data<float>() : nullptr;
  for (int64_t r = 0; r < rows; ++r) {
    const float* px = x + r * cols;
    double sum = 0;
    for (int64_t c = 0; c < cols; ++c) sum += px[c];
    const double mean = sum / static_cast<double>(cols);
    double sq = 0;
    for (int64_t c = 0; c < cols; ++c) sq += (px[c] - mean) * (px[c] - mean);
    const double inv = 1.0 / std::sqrt(sq / static_cast<double>(cols) + epsilon);
    for (int64_t c = 0; c < cols; ++c)
      out[r * cols + c] = static_cast<float>((px[c] - mean) * inv * scale[c] + bias[c]);
    if (mean_out != nullptr) mean_out[r] = static_cast<float>(mean);
    if (inv_out != nullptr) inv_out[r] = static_cast<float>(inv);
  }
}

namespace {

// ReduceMean / ReduceSum(data[, axes]): the mean or sum over `axes` (all when empty, unless
// noop_with_empty_axes makes it the identity), keeping them as 1s when keepdims (default 1).
// `axes_input_from` is the opset from which axes is an input rather than an attribute (ReduceSum
// 13, ReduceMean 18). Integer means truncate like onnxruntime's; integer sums wrap.
void run_reduce(OpContext& ctx, std::string_view op, int axes_input_from, bool mean) {
  const OnnxElemType type = ctx.input_type(0);
  const Shape& in = ctx.input_shape(0);
  const int rank = static_cast<int>(in.size());
  std::vector<int64_t> axes;
  bool noop_when_empty = false;
  if (ctx.opset() >= axes_input_from) {
    KILN_CHECK(!ctx.has_attr("axes"),
               "{} takes axes as an input from opset {} on, not as an attribute (this graph is "
               "opset {})",
               op, axes_input_from, ctx.opset());
    if (ctx.has_input(1)) axes = ctx.input_ints(1, "axes");
    noop_when_empty = ctx.attr_int("noop_with_empty_axes", 0) != 0;
  } else {
    KILN_CHECK(ctx.input_count() <= 1,
               "{} takes axes as an attribute before opset {}, not as an input (this graph is "
               "opset {})",
               op, axes_input_from, ctx.opset());
    axes = ctx.attr_ints("axes");
  }
  const bool keepdims = ctx.attr_int("keepdims", 1) != 0;
  std::vector<bool> reduced(rank, axes.empty() && !noop_when_empty);
  for (int64_t a : axes) {
    const int axis = normalize_axis(a, rank, fmt::format("{} axis", op));
    KILN_CHECK(!reduced[axis], "{} axes {} name axis {} twice", op, shape_str(axes), axis);
    reduced[axis] = true;
  }
  Shape kept = in, out;
  for (int d = 0; d < rank; ++d) {
    if (reduced[d]) kept[d] = 1;
    if (!reduced[d] || keepdims) out.push_back(kept[d]);
  }
  ImportTensor& y = ctx.set_output(0, type, out);
  if (ctx.shape_only()) return;
  const ImportTensor& x = ctx.input(0);
  // Each input element adds into its output element: the kept shape's strides, 0 where reduced.
  Shape strides = row_major_strides(kept);
  for (int d = 0; d < rank; ++d)
    if (reduced[d]) strides[d] = 0;
  const int64_t count = y.numel() == 0 ? 1 : x.numel() / y.numel();
  visit_numeric(type, op, [&](auto tag) {
    using T = decltype(tag);
    using Acc = std::conditional_t<std::is_floating_point_v<T>, double, int64_t>;
    std::vector<Acc> sums(static_cast<size_t>(y.numel()), Acc{0});
    const T* px = x.data<T>();
    for_each_row<1>(in, {strides}, [&](int64_t o, const auto& off, const auto& step, int64_t n) {
      for (int64_t j = 0; j < n; ++j)
        sums[off[0] + j * step[0]] = wrap_add<Acc>(sums[off[0] + j * step[0]], px[o + j]);
    });
    T* py = y.mutable_data<T>();
    for (size_t i = 0; i < sums.size(); ++i) {
      if constexpr (std::is_floating_point_v<T>)
        py[i] = static_cast<T>(mean ? sums[i] / static_cast<double>(count) : sums[i]);
      else if (!mean)
        py[i] = static_cast<T>(sums[i]);  // modulo 2^bits (C++20)
      else
        py[i] = static_cast<T>(count == 0 ? 0 : sums[i] / count);
    }
  });
}

}  // namespace

void run_reduce_mean(OpContext& ctx) { run_reduce(ctx, "ReduceMean", 18, true); }
void run_reduce_sum(OpContext& ctx) { run_reduce(ctx, "ReduceSum", 13, false); }

}  // namespace kiln
