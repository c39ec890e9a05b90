// One node of the import graph through its kernel: the kernel lookup, float16/bfloat16 computed
// in float where the kernel asks for it, and errors that name the file and the node.
#pragma once

#include <vector>

#include "frontend/onnx/import_graph.h"
#include "frontend/onnx/import_tensor.h"

namespace kiln {

// `inputs`: one per node input (null for an omitted one). Returns one tensor per node output
// (unknown for an omitted one). Throws ValueNotKnown (op_context.h) when shape inference needs
// what is not known, kiln::Error "FILE: node 'NAME' (OP): ..." for anything wrong.
std::vector<ImportTensor> run_import_node(const ImportGraph& graph, int node,
                                          const std::vector<const ImportTensor*>& inputs);

}  // namespace kiln
