// Lifting: subgraphs of the import graph recognised as kiln's own ops, with their parameters
// read from the graph's constants. Each lift names the import nodes it covers; what no lift
// covers stays generic (run by the interpreter only). The model assembly (lift_model.h) then
// turns a fully lifted graph into a T5 or BLOOM model.
//
//   embedding   Gather(table [vocab, d] constant, ids)
//   linear      MatMul(x, W [in, out] constant) [+ Add(b [out] constant)]
//   layer_norm  LayerNormalization(x, scale, bias) with constant scale and bias, or torch's
//               decomposition before opset 17 (x - mean, its mean square, + eps, Sqrt, Div, Mul,
//               Add), checked on probe data
//   rms_norm    x * 1/sqrt(ReduceMean(x^2) + eps) * w (T5LayerNorm), checked on probe data
//   gelu        tanh or erf GELU decompositions anchored on their Tanh / Erf, checked on probe
//               data against the formula
//   attention   the subgraph from the Q/K/V projections' outputs to the output projection's
//               input around one Softmax (lift_attention.cc)
//   fp16_clamp  HF T5's fp16 overflow guard (PatternGraph::overflow_clamp): covered and looked
//               through, nothing in the plan (its residual stream stays f32)
#pragma once

#include <string>
#include <vector>

#include "core/logging.h"
#include "core/tensor.h"
#include "frontend/onnx/pattern.h"
#include "graph/attrs.h"

namespace kiln {

enum class LiftedKind : uint8_t {
  kEmbedding,
  kLinear,
  kLayerNorm,
  kRmsNorm,
  kGelu,
  kAttention,
  kOverflowClamp,
};
std::string_view lifted_kind_name(LiftedKind kind);

struct LiftedAttention {
  // Values the attention reads: the projections' outputs (one value for all three when the
  // QKV projection is fused, laid out [head, 3, head_dim] as BLOOM's query_key_value).
  int q = -1, k = -1, v = -1;
  bool fused_qkv = false;
  int num_heads = 0, head_dim = 0;
  float scale = 1.0f;  // the product of every constant factor on the scores
  PositionBias bias = PositionBias::kNone;
  bool causal = false;
  // T5 relative bias: the table [num_buckets, heads] and how buckets are computed.
  int bias_table = -1;  // value of the table initializer
  bool bidirectional_buckets = false;
  int num_buckets = 0, max_distance = 0;
  // ALiBi: the slopes the graph multiplies positions by (checked against BLOOM's).
  std::vector<float> slopes;
  // Whether the padding mask (a graph input) reaches the scores.
  bool padding_mask = false;
};

struct LiftedOp {
  LiftedKind kind;
  std::string anchor;  // name of the node the match started from
  int input = -1;      // the value it reads (attention: the score MatMul's query side)
  int output = -1;     // the value it computes
  std::vector<int> nodes;
  // linear: [out, in] (the checkpoint's layout) and [out] or undefined; norms: scale [d], bias
  // [d] or undefined; embedding: the table [vocab, d].
  Tensor weight, bias;
  double eps = 0.0;
  Activation activation = Activation::kGeluTanh;
  LiftedAttention attention;
  // "linear 64 -> 192 + bias", for logs.
  std::string summary() const;
};

struct LiftResult {
  std::vector<LiftedOp> ops;
  std::vector<PatternFailure> failures;
  std::vector<int> op_of_node;  // per import node: the op covering it, -1 if none
  // The op computing `value`, -1 if none.
  int op_computing(int value) const;
  // Import nodes no lift covers and that are not constants folded at build time, by op type.
  std::vector<int> generic_nodes;
};

// Lifts what it recognises, logging each match at debug level and a summary at info.
LiftResult lift_import_graph(const PatternGraph& g, const Logger& log);

// The attention lift around one Softmax node (lift_attention.cc). Linear lifts must be done:
// the Q/K/V sources are their outputs. Returns false and fills `failure` when the subgraph is
// not one kiln's Attention computes.
bool lift_attention(const PatternGraph& g, const LiftResult& lifted, int softmax, LiftedOp* op,
                    PatternFailure* failure);

}  // namespace kiln
