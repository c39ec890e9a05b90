// Checks a graph's invariants: ids in range, every input defined before use, topological order,
// arity and shapes as the op registry infers them, outputs defined, weights holding data of
// their declared type. Throws kiln::Error naming the first violation.
#pragma once

#include "graph/ir.h"

namespace kiln {

void verify_graph(const Graph& graph);

}  // namespace kiln
