// Per-op schema (arity) and shape inference, in one table indexed by OpKind.
#pragma once

#include <string_view>
#include <vector>

#include "graph/ir.h"

namespace kiln {

struct ValueType {
  DType dtype;
  SymShape shape;
};

struct OpSchema {
  OpKind op;
  std::string_view name;
  int min_inputs;
  int max_inputs;
  int num_outputs;
  AttrKind attrs;  // which OpAttrs alternative the op's nodes hold
  // Checks the inputs' dtypes and shapes against the op's contract and returns the outputs'.
  // Throws kiln::Error naming the node and the offending input.
  std::vector<ValueType> (*infer)(const Graph& graph, const Node& node);
};

const OpSchema& op_schema(OpKind op);
// Runs the schema's arity checks and shape inference.
std::vector<ValueType> infer_node(const Graph& graph, const Node& node);

}  // namespace kiln
