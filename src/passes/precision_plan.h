// The precision pass's decisions for one graph (passes/pass.h: assign_precision), made before
// anything is converted: which nodes compute wider than the plan's activation type, which
// weights are stored wider than their readers' type, and why, from the device's row of
// core/target.h's table, the graph's structure and the caller's requests (PrecisionOptions).
// Nothing here reads a weight's name.
#pragma once

#include <string>
#include <vector>

#include "core/target.h"
#include "graph/model_ir.h"
#include "passes/pass.h"

namespace kiln {

struct PrecisionPlan {
  const PrecisionSupport* support = nullptr;
  // Per node: computes in f32 (its activations, and on a narrow-activation device the weights of
  // a wide Linear) and why; empty reasons for nodes in the plan's type.
  std::vector<bool> wide;
  std::vector<std::string> node_why;
  // Per value: the type a weight is stored in, and why when wider than the plan says for its
  // readers (activations: unused).
  std::vector<DType> weight;
  std::vector<std::string> weight_why;
  // Precisions with calibrated inputs (W8A8), per node: a Linear's calibrated input scale
  // (it reads x as int8), or negative when its input stays f32, then with the reason in
  // input_why (empty for nodes that are no Linear, and for Linears kept wide: node_why says).
  std::vector<float> input_scale;
  std::vector<std::string> input_why;
  // Matrices kept wider because the type cannot hold them (the build log warns).
  std::vector<std::string> warnings;
};

// The Linear that computes the decoder's logits (the graph contract's `logits` output, through
// any Cast), or -1.
int logits_linear(const Graph& graph);

PrecisionPlan plan_precision(const Graph& graph, const PrecisionSupport& support,
                             const PrecisionOptions& options);

// Carries out a plan on a narrow-activation device (CUDA fp16/bf16/int8-weight): every float
// weight and activation in the plan's type except the wide nodes' (with Casts between), matrices
// the plan quantizes stored int8 with their scales (quantize_weight; an Embedding of an int8
// table gathers f32 rows, narrowed by a Cast), logits widened to f32 by a Cast. Returns the
// weights and activations narrowed and the matrices quantized. (narrow_graph.cc)
int narrow_graph(Graph& graph, const PrecisionPlan& plan, const Logger& log);

// Stores weight `id` (f32) as `to`, i8 (per-row f32 scales) or i4 (f16 group scales): its scales
// become a weight "<name>.scales" that every reader takes, a Linear as its kWeightScales operand,
// an Embedding as input 2. Returns the bytes stored (values and scales). (assign_precision.cc)
int64_t quantize_weight(Graph& graph, int id, DType to);

// Why `w` cannot be stored as `to` (a non-finite value; fp16's range); empty when it can.
std::string narrowing_refused(const Tensor& w, DType to);

}  // namespace kiln
