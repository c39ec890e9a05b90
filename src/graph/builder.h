// Builds graphs op by op, the way TensorRT's network definition API does: each call adds a node,
// runs shape inference and returns the id of the new value.
#pragma once

#include <string>

#include "graph/ir.h"

namespace kiln {

class GraphBuilder {
 public:
  explicit GraphBuilder(std::string name) { graph_.name = std::move(name); }

  int input(const std::string& name, DType dtype, SymShape shape);
  // A constant; names must be unique within the graph.
  int weight(const std::string& name, Tensor data);
  // A constant read in f32: narrower data (f16/bf16 checkpoints) gets a Cast node named
  // "<name>.f32", which constant folding resolves. Returns the value to read.
  int weight_f32(const std::string& name, Tensor data);
  void output(int value, const std::string& name);

  int embedding(int table, int ids, const std::string& name);
  // An i8 table [vocab, d] with its f32 per-row scales [vocab]: gathers f32 rows q · scale.
  int embedding_quantized(int table, int ids, int scales, const std::string& name);
  int linear(int x, int w, int bias, const std::string& name);  // bias = -1 for none
  // An i8 weight [out, in] with its f32 per-output-channel scales [out]: y = x·(w·scale)ᵀ.
  int linear_quantized(int x, int w, int bias, int scales, const std::string& name);
  int add(int a, int b, const std::string& name);
  int mul(int a, int b, const std::string& name);
  int scale(int x, float factor, const std::string& name);
  int rms_norm(int x, int w, double eps, const std::string& name);
  int layer_norm(int x, int w, int b, double eps, const std::string& name);
  int activation(int x, Activation act, const std::string& name);
  int gated_activation(int gate, int up, Activation act, const std::string& name);
  int softmax(int x, const std::string& name);
  int cast(int x, DType dtype, const std::string& name);
  // q, k, v as AttentionAttrs documents; pass -1 for inputs the kind does not take.
  int attention(int q, int k, int v, int rel_table, const AttentionAttrs& attrs,
                const std::string& name);
  int gather_rows(int x, int rows, const std::string& name);

  const Graph& graph() const { return graph_; }
  Graph finish();

 private:
  int add_node(OpKind op, std::vector<int> inputs, OpAttrs attrs, const std::string& name);
  Graph graph_;
};

}  // namespace kiln
