// SmoothQuant (Xiao et al., "SmoothQuant: Accurate and Efficient Post-Training Quantization for
// Large Language Models", 2023) for W8A8 plans: a Linear input's outlier channels are migrated
// into the weights, channel by channel, before quantizing. For input channel j of a tensor X
// read by Linears W:
//   s_j = max|X_j|^α / max_o |W_oj|^(1-α)   (both at least 1e-5; α in (0, 1])
//   X' = X / s, folded into the norm that makes X (its gamma, and a LayerNorm's beta, divided by s)
//   W' = W · diag(s) for every Linear reading X (its weight's column j multiplied by s_j),
// so that X' · W'ᵀ = X · Wᵀ in exact arithmetic: the float model computes the same function, and
// X' is easier to quantize with one scale per tensor. Only the output of a norm (LayerNorm,
// RMSNorm, AddRMSNorm's normalized output) can be smoothed, when Linears alone read it — none of
// them the logits Linear (whose input stays f32 in int8 plans) or one kept in float, each weight
// an f32 matrix no other node reads — and it is no graph output. BLOOM: every block's two norms
// (into query_key_value and dense_h_to_4h). T5: every norm into the self-attention's q/k/v, the
// cross-attention's q and the gated FFN's input; the encoder's final norm is a graph output
// (encoder_hidden) and is left alone.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/logging.h"
#include "graph/model_ir.h"

namespace kiln {

struct SmoothTarget {
  int norm;                  // the node making the tensor
  int value;                 // the tensor (the norm's normalized output)
  std::vector<int> linears;  // the Linears reading it (as their input x)
};
// The tensors of `graph` SmoothQuant can smooth, in node order. `keep_float`: Linears kept in
// float by name (PrecisionOptions::keep_float), whose inputs are not smoothed.
std::vector<SmoothTarget> smoothable_tensors(const Graph& graph,
                                             const std::vector<std::string>& keep_float);

// The factors s of every smoothable tensor of `model` (named as calibration names them,
// calibration_cache.h) from its channel maxima (`channel_amax`, the calibration's statistics of
// the unsmoothed model) and its Linears' weights, which must be plain (unpacked) f32 matrices.
// Throws naming a tensor without statistics or of another width.
std::map<std::string, std::vector<float>> smoothquant_factors(
    const ModelIR& model, const std::map<std::string, std::vector<float>>& channel_amax,
    double alpha, const std::vector<std::string>& keep_float);

// Folds the factors of this graph's tensors (`factors`: every graph's, by calibration name) into
// their norms and their Linears' weights (new f32 tensors: checkpoint mappings are not written).
// Before the precision pass. A usage error naming a tensor of this graph that cannot be smoothed
// (another model's cache) or whose factors are not one per channel. Returns the tensors smoothed.
int apply_smoothing(Graph& graph, const std::map<std::string, std::vector<float>>& factors,
                    const std::vector<std::string>& keep_float, const Logger& log);

}  // namespace kiln
