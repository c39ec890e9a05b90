// kiln's reference interpreter of ONNX import graphs: one forward pass on named inputs, correct
// on the CPU rather than fast (`kiln exec --onnx`, and the oracle of the ONNX frontend's tests).
// The inputs are checked against the graph's declarations first; the graph is folded for their
// concrete shapes (fold_import_graph.h), then the remaining nodes run in order, each value freed
// after its last reader.
#pragma once

#include <map>
#include <string>

#include "frontend/onnx/import_graph.h"
#include "frontend/onnx/import_tensor.h"

namespace kiln {

struct ImportRunStats {
  int folded_nodes = 0;    // computed while folding for the inputs' shapes
  int executed_nodes = 0;  // run on the input data
};

// Checks `inputs` against the graph's inputs: every input given, no unknown name, the declared
// element type and rank, numeric dimensions equal, and a symbolic dimension ("batch") the same
// size in every input that names it. Errors name the input and what was expected
// ("input 'input_ids' is float[2, 11], expected int64[batch, sequence]"); usage errors.
void check_import_inputs(const ImportGraph& graph,
                         const std::map<std::string, ImportTensor>& inputs);

// Every graph output by name. Throws kiln::Error naming the file and node for a node that fails
// (shapes that do not match, an index out of range, ...) and for ops kiln does not import.
std::map<std::string, ImportTensor> run_import_graph(
    const ImportGraph& graph, const std::map<std::string, ImportTensor>& inputs,
    ImportRunStats* stats = nullptr);

}  // namespace kiln
