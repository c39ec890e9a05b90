#include "passes/awq.h"

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "core/half.h"
#include "graph/linear.h"
#include "passes/calibration_cache.h"
#include "passes/quantize_weights.h"
#include "passes/smooth_quant.h"

namespace kiln {
namespace {

constexpr float kFloor = 1e-5f;

// s_j = m_j^α, divided by the geometric mean of its extremes (AWQ's normalization: the factors
// straddle 1, so neither the weights nor the norm's gamma drift far in magnitude).
std::vector<float> factors_for(const std::vector<float>& mean_abs, double alpha) {
  std::vector<float> s(mean_abs.size());
  float lo = INFINITY, hi = 0.0f;
  for (size_t j = 0; j < s.size(); ++j) {
    s[j] = static_cast<float>(std::pow(std::max(mean_abs[j], kFloor), alpha));
    lo = std::min(lo, s[j]);
    hi = std::max(hi, s[j]);
  }
  const float norm = std::sqrt(lo * hi);
  for (float& f : s) f /= norm;
  return s;
}

// Σ_rows Σ_o ((Q(W·diag(s))·diag(1/s) − W)_o · x)² for one Linear weight w [out, in], the output
// rows shared among `pool`'s threads. Each output row's sum is kept apart and the rows are added
// in order, so the result does not depend on the number of threads.
double output_error(const Tensor& w, const std::vector<float>& s, const std::vector<float>& rows,
                    int64_t n, ThreadPool* pool) {
  const int64_t out = w.dim(0), in = w.dim(1);
  const float* src = w.data<float>();
  std::vector<double> per_row(static_cast<size_t>(out), 0.0);
  auto rows_of = [&](int64_t o0, int64_t o1) {
    std::vector<float> scaled(static_cast<size_t>(in)), delta(static_cast<size_t>(in));
    std::vector<int8_t> q(static_cast<size_t>(in));
    std::vector<uint16_t> bits(static_cast<size_t>(int4_groups(in)));
    const float* dr = delta.data();
    for (int64_t o = o0; o < o1; ++o) {
      // Row o scaled, quantized as the plan stores it, unscaled: its difference from w.
      const float* wr = src + o * in;
      for (int64_t j = 0; j < in; ++j) scaled[j] = wr[j] * s[j];
      quantize_row_int4(scaled.data(), in, q.data(), bits.data());
      for (int64_t j = 0; j < in; ++j)
        delta[j] = static_cast<float>(q[j]) * fp16_to_float(bits[j / kInt4Group]) / s[j] - wr[j];
      double err = 0.0;
      int64_t r = 0;
      // Four sampled rows a pass: each delta element loaded once for four products.
      for (; r + 4 <= n; r += 4) {
        const float* x0 = rows.data() + r * in;
        const float *x1 = x0 + in, *x2 = x1 + in, *x3 = x2 + in;
        float a0 = 0.0f, a1 = 0.0f, a2 = 0.0f, a3 = 0.0f;
#pragma omp simd reduction(+ : a0, a1, a2, a3)
        for (int64_t j = 0; j < in; ++j) {
          a0 += dr[j] * x0[j];
          a1 += dr[j] * x1[j];
          a2 += dr[j] * x2[j];
          a3 += dr[j] * x3[j];
        }
        err += static_cast<double>(a0) * a0 + static_cast<double>(a1) * a1 +
               static_cast<double>(a2) * a2 + static_cast<double>(a3) * a3;
      }
      for (; r < n; ++r) {
        const float* x = rows.data() + r * in;
        float acc = 0.0f;
#pragma omp simd reduction(+ : acc)
        for (int64_t j = 0; j < in; ++j) acc += dr[j] * x[j];
        err += static_cast<double>(acc) * acc;
      }
      per_row[static_cast<size_t>(o)] = err;
    }
  };
  if (pool != nullptr)
    pool->parallel_for(out, 16, rows_of);
  else
    rows_of(0, out);
  double err = 0.0;
  for (double e : per_row) err += e;
  return err;
}

}  // namespace

AwqResult awq_search(const ModelIR& model, const std::map<std::string, AwqTensorStats>& stats,
                     const std::vector<std::string>& keep_float, int grid, ThreadPool* pool) {
  KILN_CHECK_USAGE(grid >= 1 && grid <= 1000, "the AWQ grid must have 1..1000 steps, got {}", grid);
  AwqResult result;
  result.model = calibration_fingerprint(model);
  for (const Graph& g : model.graphs)
    for (const SmoothTarget& t : smoothable_tensors(g, keep_float)) {
      const std::string name = calibrated_tensor_name(g, t.value);
      const auto it = stats.find(name);
      KILN_CHECK(it != stats.end(), "awq: no calibration statistics for {}", name);
      const AwqTensorStats& st = it->second;
      const int64_t width = static_cast<int64_t>(st.channel_mean_abs.size());
      KILN_CHECK(width > 0 && static_cast<int64_t>(st.rows.size()) % width == 0,
                 "awq: {} has {} channel means and {} sampled values", name, width, st.rows.size());
      const int64_t n = static_cast<int64_t>(st.rows.size()) / width;
      std::vector<const Tensor*> weights;
      std::string refused;
      for (int r : t.linears) {
        const Tensor& w = g.values[linear_operand(g.nodes[r], LinearOperand::kWeight)].data;
        KILN_CHECK(w.rank() == 2 && w.dim(1) == width && w.dtype() == DType::kF32,
                   "awq: {} has {} channels, its reader {} takes a {} weight", name, width,
                   g.nodes[r].name, shape_str(w.shape()));
        const std::string why = int4_refused(w);
        if (!why.empty()) refused = g.nodes[r].name + ": " + why;
        weights.push_back(&w);
      }
      if (!refused.empty() || n == 0) {
        result.skipped.push_back(name + ": " + (n == 0 ? "no sampled rows" : refused));
        continue;
      }
      AwqChoice choice;
      choice.linears = static_cast<int>(weights.size());
      std::vector<float> best;
      for (int i = 0; i <= grid; ++i) {
        const double alpha = static_cast<double>(i) / grid;
        const std::vector<float> s = factors_for(st.channel_mean_abs, alpha);
        double err = 0.0;
        for (const Tensor* w : weights) err += output_error(*w, s, st.rows, n, pool);
        if (i == 0) choice.plain_error = err;
        if (i == 0 || err < choice.error) {
          choice.error = err;
          choice.alpha = alpha;
          best = s;
        }
      }
      if (choice.alpha > 0.0) result.factors[name] = std::move(best);
      result.choices[name] = choice;
    }
  return result;
}

}  // namespace kiln
