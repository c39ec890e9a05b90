// Constant and shape folding of the import graph at build time (polygraphy's fold-constants):
// every node whose outputs can be computed before the graph runs — it reads only initializers,
// Constant nodes and values folded before it, or, like Shape, only the shape of a value whose
// shape is known from the inputs' concrete dimensions — is run once and its outputs become
// constants. The other nodes get shapes where shape inference (the same kernels, run on shapes
// alone) finds them.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "frontend/onnx/import_graph.h"
#include "frontend/onnx/import_tensor.h"

namespace kiln {

struct FoldedGraph {
  // Per value: full for a constant that a node left to run (or a graph output) reads,
  // shape-only where the shape is known, unknown otherwise.
  std::vector<ImportTensor> known;
  // Per node: computed at build time.
  std::vector<bool> folded;
  int folded_nodes = 0;
  // Nodes left to run, in the graph's order.
  std::vector<int> remaining;
};

// `input_shapes`: concrete dimensions by graph input name. An input not named there is known by
// its declared shape when every dimension is a number, else not known (symbolic dims such as
// batch stay unknown and so does everything computed from them). Throws kiln::Error naming the
// node when a folded node fails (a shape mismatch found before the graph runs).
// `keep_all_data`: keep the elements of every value computed (lifting reads shape-derived
// tables, such as position buckets, at probe shapes), not only of those a remaining node reads.
FoldedGraph fold_import_graph(const ImportGraph& graph,
                              const std::map<std::string, Shape>& input_shapes = {},
                              bool keep_all_data = false);

}  // namespace kiln
