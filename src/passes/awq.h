// AWQ's scale search (Lin et al., "AWQ: Activation-aware Weight Quantization for LLM Compression
// and Acceleration", 2024) for int4-weight plans. A Linear's error from quantizing its weights
// group by group falls mostly on the inputs whose activations are large (the "salient" channels):
// scaling those weight columns up before quantizing gives them finer levels. For a tensor X
// read by Linears W (the tensors SmoothQuant can smooth, passes/smooth_quant.h: a norm's output
// read by Linears only), with m_j the mean |X_j| over the calibration rows:
//   s_j = m_j^α / sqrt(max_k m_k^α · min_k m_k^α)     (m_j at least 1e-5)
//   W' = W · diag(s) quantized to i4 groups (passes/quantize_weights.h), X' = X / s folded into
//   the norm (apply_smoothing), so the float model computes the same function;
// α is searched on a grid of [0, 1] for the least squared output error
//   Σ_rows Σ_o ((Q(W')·diag(1/s) − W)_o · x)²
// over every Linear reading X and the sampled calibration rows x. α = 0 (s = 1) is plain
// quantization and on the grid, so the choice never measures worse than it on those rows. The
// clipping search of the paper's released code is not done.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/thread_pool.h"
#include "graph/model_ir.h"

namespace kiln {

// What the search needs of one tensor, from calibration (builder/calibration_runner.h).
struct AwqTensorStats {
  std::vector<float> channel_mean_abs;  // [width]
  std::vector<float> rows;              // sampled rows [n, width], row-major
};

struct AwqChoice {
  double alpha = 0.0;        // the grid point chosen (0: left unscaled)
  double error = 0.0;        // its squared output error, summed over Linears and sampled rows
  double plain_error = 0.0;  // the same at α = 0
  int linears = 0;           // the Linears reading the tensor
};

struct AwqResult {
  std::string model;  // calibration_fingerprint of the model searched (its cache's model=)
  // Per tensor (calibration names) with α > 0: its factors s, for PrecisionOptions::smoothing.
  std::map<std::string, std::vector<float>> factors;
  std::map<std::string, AwqChoice> choices;  // every tensor searched
  std::vector<std::string> skipped;          // "name: why" (a weight i4 cannot hold, no rows)
};

// The search over every smoothable tensor of `model` (an fp32 build before the precision pass,
// weights plain f32 [out, in], not packed), with `grid` + 1 points α = 0, 1/grid, ..., 1.
// Throws naming a tensor without statistics, or with rows of another width. `pool` (optional)
// shares the work; the result is the same with any number of threads.
AwqResult awq_search(const ModelIR& model, const std::map<std::string, AwqTensorStats>& stats,
                     const std::vector<std::string>& keep_float, int grid = 20,
                     ThreadPool* pool = nullptr);

}  // namespace kiln
