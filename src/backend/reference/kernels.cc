// Reference kernels for every op but Attention. A fused op computes exactly what its unfused
// pair does, intermediate rounding included (Linear + activation rounds the linear output to the
// activation dtype first, as the separate Linear would), so fusion passes can be checked
// against the reference too.
#include <cmath>
#include <cstring>

#include "backend/reference/kernels.h"

namespace kiln::reference {
namespace {

double at(const Tensor& t, int64_t i) { return element(t.raw(), t.dtype(), i); }
void put(Tensor& t, int64_t i, double x) { set_element(t.raw(), t.dtype(), i, x); }

// x [rows, d], w [d] -> w * x / sqrt(mean(x^2) + eps) for one row (T5LayerNorm: no mean is
// subtracted, no bias).
void rms_row(const std::vector<double>& x, int64_t row, int64_t d, const Tensor& w, double eps,
             Tensor& y) {
  double sum_sq = 0.0;
  for (int64_t i = 0; i < d; ++i) sum_sq += x[row * d + i] * x[row * d + i];
  const double inv_rms = 1.0 / std::sqrt(sum_sq / static_cast<double>(d) + eps);
  for (int64_t i = 0; i < d; ++i) put(y, row * d + i, at(w, i) * (x[row * d + i] * inv_rms));
}

// x [rows, d], w [d], b [d] -> (x - mean) / sqrt(var + eps) * w + b for one row, biased variance.
void layer_row(const std::vector<double>& x, int64_t row, int64_t d, const Tensor& w,
               const Tensor& b, double eps, Tensor& y, int64_t out_row) {
  double mean = 0.0, var = 0.0;
  for (int64_t i = 0; i < d; ++i) mean += x[row * d + i];
  mean /= static_cast<double>(d);
  for (int64_t i = 0; i < d; ++i) var += (x[row * d + i] - mean) * (x[row * d + i] - mean);
  var /= static_cast<double>(d);
  const double inv_std = 1.0 / std::sqrt(var + eps);
  for (int64_t i = 0; i < d; ++i)
    put(y, out_row * d + i, (x[row * d + i] - mean) * inv_std * at(w, i) + at(b, i));
}

// Copies row `src` of a [n, d] tensor into row `dst` of a [r, d] tensor of the same dtype.
void copy_row(const Tensor& from, int64_t src, Tensor& to, int64_t dst, int64_t d) {
  const size_t row_bytes = dtype_bytes(from.dtype(), static_cast<size_t>(d));
  std::memcpy(static_cast<char*>(to.raw()) + dst * row_bytes,
              static_cast<const char*>(from.raw()) + src * row_bytes, row_bytes);
}

}  // namespace

// table [vocab, d], ids [n] (i64 or i32), scales [vocab] (i8 tables) -> [n, d]
void embedding(const Node& node, const KernelArgs& args) {
  const Tensor& table = args.in[0];
  const Tensor& ids = args.in[1];
  const bool has_scales = args.in.size() > 2 && args.in[2].defined();
  const int64_t vocab = table.dim(0), d = table.dim(1);
  for (int64_t t = 0; t < ids.dim(0); ++t) {
    const int64_t id = index_element(ids, t);
    KILN_CHECK(id >= 0 && id < vocab, "node '{}': token id {} is outside the vocabulary [0, {})",
               node.name, id, vocab);
    if (!has_scales) {
      copy_row(table, id, args.out[0], t, d);
      continue;
    }
    const double scale = at(args.in[2], id);
    for (int64_t i = 0; i < d; ++i) put(args.out[0], t * d + i, at(table, id * d + i) * scale);
  }
}

// x [n, in], w [out, in], bias [out] (optional), scales [out] (i8 weights) or [out, groups]
// (i4 weights: each weight times its group's scale, graph/linear.h) ->
// act(x (w * scales)^T + bias) [n, out]; with an input scale s [1] (W8A8), x's int8 values q
// in place of x: act(s · q (w * scales)^T + bias) (E4M3 values for an f8_e4m3 weight).
// A folded input norm (LinearEpilogue::norm) scales each row's products by the row's 1 / std (or
// 1 / rms) after subtracting its mean times the weight's row sums (LayerNorm), with x times the
// norm's scale where the Linear has one (LinearOperand::kNormScale).
void linear(const Node& node, const KernelArgs& args) {
  const LinearEpilogue& e = node.attr<LinearAttrs>().epilogue;
  const auto operand = [&](LinearOperand o) { return linear_input(args.in, o); };
  const Tensor& x = *operand(LinearOperand::kX);
  const Tensor& w = *operand(LinearOperand::kWeight);
  const Tensor* bias = operand(LinearOperand::kBias);
  const Tensor* scales = operand(LinearOperand::kWeightScales);
  const Tensor* residual = operand(LinearOperand::kResidual);
  const Tensor* row_sums = operand(LinearOperand::kNormRowSums);
  const Tensor* norm_scale = operand(LinearOperand::kNormScale);
  // With rows, output row t is the Linear of x's row rows[t].
  const Tensor* rows = operand(LinearOperand::kRows);
  // W8A8: x read as int8 with one static scale (graph/linear.h: quantize_input), the sum of
  // integer products exact in double, then × the scale.
  const Tensor* input_scale = operand(LinearOperand::kInputScale);
  Tensor& y = args.out[0];
  const int64_t in = w.dim(1), out = w.dim(0), x_rows = x.numel() / in;
  const int64_t n = rows != nullptr ? rows->numel() : x_rows;
  // The type the Linear computes in: its output's, or its input's when widened to f32.
  const DType out_type = e.widen ? x.dtype() : y.dtype();
  std::vector<double> xs = load(x);
  std::vector<double> ws = load(w);
  if (w.dtype() == DType::kI4) {  // the group scales belong to the weight's definition
    KILN_CHECK(scales != nullptr, "node '{}': an i4 weight needs its group scales", node.name);
    const int64_t groups = scales->dim(1);
    for (int64_t o = 0; o < out; ++o)
      for (int64_t i = 0; i < in; ++i) ws[o * in + i] *= at(*scales, o * groups + i / kInt4Group);
    scales = nullptr;
  }
  double x_scale = 1.0;
  if (input_scale != nullptr) {
    const float s = input_scale->data<float>()[0];
    KILN_CHECK(std::isfinite(s) && s >= 0.0f,
               "node '{}': the input scale is {}, not a finite non-negative number", node.name, s);
    const float inv = input_inv_scale(s);
    // x's values are exact in f32 whatever its float type; an f8_e4m3 weight reads E4M3 levels.
    const bool fp8 = w.dtype() == DType::kF8E4M3;
    for (double& v : xs)
      v = fp8 ? quantize_input_fp8(static_cast<float>(v), inv)
              : quantize_input(static_cast<float>(v), inv);
    x_scale = s;
  }
  const std::vector<double> gamma =
      norm_scale != nullptr ? load(*norm_scale) : std::vector<double>(in, 1.0);
  for (int64_t t = 0; t < n; ++t) {
    const int64_t xr = rows != nullptr ? index_element(*rows, t) : t;
    KILN_CHECK(xr >= 0 && xr < x_rows, "node '{}': row {} out of range [0, {})", node.name, xr,
               x_rows);
    double mean = 0.0, inv = 1.0;
    if (e.norm) {
      double sum = 0.0, sq = 0.0;
      for (int64_t i = 0; i < in; ++i) sum += xs[xr * in + i];
      if (*e.norm == InputNorm::kLayerNorm) mean = sum / static_cast<double>(in);
      for (int64_t i = 0; i < in; ++i) sq += (xs[xr * in + i] - mean) * (xs[xr * in + i] - mean);
      inv = 1.0 / std::sqrt(sq / static_cast<double>(in) + e.norm_eps);
    }
    for (int64_t o = 0; o < out; ++o) {
      double acc = 0.0;
      for (int64_t i = 0; i < in; ++i) acc += xs[xr * in + i] * gamma[i] * ws[o * in + i];
      if (e.norm) {
        if (*e.norm == InputNorm::kLayerNorm) acc -= mean * at(*row_sums, o);
        acc *= inv;
      }
      if (input_scale != nullptr) acc *= x_scale;
      if (scales != nullptr) acc *= at(*scales, o);
      if (bias != nullptr) acc += at(*bias, o);
      if (e.activation) acc = activation(*e.activation, round_to(out_type, acc));
      // A fused residual add rounds as the Add it replaces: residual + (the Linear's output).
      if (residual != nullptr) acc = at(*residual, t * out + o) + round_to(out_type, acc);
      // A widened output is the input type's value, stored as f32.
      if (e.widen) acc = round_to(out_type, acc);
      put(y, t * out + o, acc);
    }
  }
}

// a, b [n, d] -> a + b
void add(const Node&, const KernelArgs& args) {
  for (int64_t i = 0; i < args.out[0].numel(); ++i)
    put(args.out[0], i, at(args.in[0], i) + at(args.in[1], i));
}

// a, b [n, d] -> a * b
void mul(const Node&, const KernelArgs& args) {
  for (int64_t i = 0; i < args.out[0].numel(); ++i)
    put(args.out[0], i, at(args.in[0], i) * at(args.in[1], i));
}

// x -> x * scale (the attribute is a float, as the f32 multiply sees it)
void scale(const Node& node, const KernelArgs& args) {
  const double s = node.attr<ScaleAttrs>().scale;
  for (int64_t i = 0; i < args.out[0].numel(); ++i) put(args.out[0], i, at(args.in[0], i) * s);
}

// x [n, d], w [d] -> [n, d]
void rms_norm(const Node& node, const KernelArgs& args) {
  const int64_t d = args.in[0].dim(-1), n = args.in[0].numel() / d;
  const std::vector<double> x = load(args.in[0]);
  for (int64_t r = 0; r < n; ++r)
    rms_row(x, r, d, args.in[1], node.attr<NormAttrs>().eps, args.out[0]);
}

// x [n, d], w [d], b [d] -> (x - mean) / sqrt(var + eps) * w + b, biased variance
// With rows (input 3): the rows x[rows] of a table, each normalized (a gathered embedding).
void layer_norm(const Node& node, const KernelArgs& args) {
  const int64_t d = args.in[0].dim(-1), n = args.in[0].numel() / d;
  const double eps = node.attr<NormAttrs>().eps;
  if (args.in.size() > 3 && args.in[3].defined()) {
    const Tensor& rows = args.in[3];
    std::vector<double> row(static_cast<size_t>(d));
    for (int64_t t = 0; t < rows.dim(0); ++t) {
      const int64_t id = index_element(rows, t);
      KILN_CHECK(id >= 0 && id < n, "node '{}': token id {} is outside the vocabulary [0, {})",
                 node.name, id, n);
      for (int64_t i = 0; i < d; ++i) row[i] = at(args.in[0], id * d + i);
      layer_row(row, 0, d, args.in[1], args.in[2], eps, args.out[0], t);
    }
    return;
  }
  const std::vector<double> x = load(args.in[0]);
  for (int64_t r = 0; r < n; ++r) layer_row(x, r, d, args.in[1], args.in[2], eps, args.out[0], r);
}

// x -> act(x)
void activation(const Node& node, const KernelArgs& args) {
  const Activation act = node.attr<ActivationAttrs>().activation;
  for (int64_t i = 0; i < args.out[0].numel(); ++i)
    put(args.out[0], i, activation(act, at(args.in[0], i)));
}

// gate, up [n, f] -> act(gate) * up, act(gate) rounded first as HF's separate tensor is
void gated_activation(const Node& node, const KernelArgs& args) {
  const Activation act = node.attr<ActivationAttrs>().activation;
  const DType dtype = args.out[0].dtype();
  if (args.in.size() == 1 || !args.in[1].defined()) {  // packed [n, 2f]: gate | up per row
    const int64_t f = args.out[0].dim(-1);
    for (int64_t i = 0; i < args.out[0].numel(); ++i) {
      const int64_t r = i / f, c = i % f;
      put(args.out[0], i,
          round_to(dtype, activation(act, at(args.in[0], r * 2 * f + c))) *
              at(args.in[0], r * 2 * f + f + c));
    }
    return;
  }
  for (int64_t i = 0; i < args.out[0].numel(); ++i)
    put(args.out[0], i, round_to(dtype, activation(act, at(args.in[0], i))) * at(args.in[1], i));
}

// x [n, d] -> exp(x - max) / sum exp(x - max) over d; -inf scores get probability 0
void softmax(const Node&, const KernelArgs& args) {
  const Tensor& x = args.in[0];
  const int64_t d = x.dim(-1), n = x.numel() / d;
  for (int64_t r = 0; r < n; ++r) {
    double mx = -INFINITY, sum = 0.0;
    for (int64_t i = 0; i < d; ++i) mx = std::max(mx, at(x, r * d + i));
    for (int64_t i = 0; i < d; ++i) sum += std::exp(at(x, r * d + i) - mx);
    for (int64_t i = 0; i < d; ++i)
      put(args.out[0], r * d + i, std::exp(at(x, r * d + i) - mx) / sum);
  }
}

// x -> x in CastAttrs::to, rounded to nearest even
void cast(const Node&, const KernelArgs& args) {
  for (int64_t i = 0; i < args.out[0].numel(); ++i) put(args.out[0], i, at(args.in[0], i));
}

// x [n, d], rows [r] i64 -> [r, d]
void gather_rows(const Node& node, const KernelArgs& args) {
  const Tensor& x = args.in[0];
  const Tensor& rows = args.in[1];
  const int64_t n = x.dim(0), d = x.dim(1);
  for (int64_t i = 0; i < rows.dim(0); ++i) {
    const int64_t src = index_element(rows, i);
    KILN_CHECK(src >= 0 && src < n, "node '{}': row {} out of range [0, {})", node.name, src, n);
    copy_row(x, src, args.out[0], i, d);
  }
}

// a, b [n, d], w [d] -> (a + b, rmsnorm(a + b) * w); the norm reads the sum as stored
void add_rms_norm(const Node& node, const KernelArgs& args) {
  Tensor& sum = args.out[0];
  const int64_t d = sum.dim(-1), n = sum.numel() / d;
  std::vector<double> stored(static_cast<size_t>(sum.numel()));
  for (int64_t i = 0; i < sum.numel(); ++i) {
    stored[i] = round_to(sum.dtype(), at(args.in[0], i) + at(args.in[1], i));
    put(sum, i, stored[i]);
  }
  for (int64_t r = 0; r < n; ++r)
    rms_row(stored, r, d, args.in[2], node.attr<NormAttrs>().eps, args.out[1]);
}

}  // namespace kiln::reference
