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

// The checks shape inference is written with; each throws naming the node, its op and the input.
namespace schema {
const Value& in(const Graph& g, const Node& n, size_t i);  // input i, which must be present
void expect_rank(const Node& n, const Value& v, size_t rank);
void expect_float(const Node& n, const Value& v);
void expect_dim(const Node& n, const Value& v, size_t axis, const Dim& d);
void expect_same(const Node& n, const Value& a, const Value& b);
// x [n, d] read at the rows `rows` [r] (i64/i32) of an op's optional rows input.
void expect_gathered_rows(const Node& n, const Value& x, const Value& rows);
}  // namespace schema

}  // namespace kiln
