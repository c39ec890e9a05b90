// Residual Add followed by RMSNorm of the sum → one AddRMSNorm node producing both the sum
// (the residual stream) and its norm, so the sum is read once.
#include "passes/pass.h"

namespace kiln {

int fuse_add_rms_norm(Graph& graph, const Logger& log) {
  std::vector<bool> erase(graph.nodes.size(), false);
  int fused = 0;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    Node& norm = graph.nodes[i];
    if (norm.op != OpKind::kRmsNorm) continue;
    const int sum = norm.inputs[0];
    const int producer = graph.values[sum].producer;
    if (producer < 0 || graph.nodes[producer].op != OpKind::kAdd) continue;
    // The fused node takes the Add's place, so the norm's weight must exist by then (it can be
    // computed, e.g. a Cast that constant folding did not resolve).
    const Value& weight = graph.values[norm.inputs[1]];
    if (weight.kind == ValueKind::kActivation && weight.producer > producer) continue;
    Node& add = graph.nodes[producer];
    // AddRMSNorm(a, b, w) -> (a + b, rmsnorm(a + b)); it sits where the Add was, and every
    // reader of the norm comes after the norm, hence after the Add.
    add.op = OpKind::kAddRmsNorm;
    add.inputs.push_back(norm.inputs[1]);
    add.attrs = norm.attrs;
    const int normed = norm.outputs[0];
    graph.values[normed].producer = producer;
    add.outputs.push_back(normed);
    erase[i] = true;
    ++fused;
  }
  if (fused == 0) return 0;
  remove_nodes(graph, erase);
  compact_values(graph);
  log.info("fuse_add_rms_norm[{}]: fused {} residual Add+RMSNorm pairs", graph.name, fused);
  return fused;
}

}  // namespace kiln
