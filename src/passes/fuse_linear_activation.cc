#include "passes/pass.h"

namespace kiln {
int fuse_linear_activation(Graph& graph, const Logger& log) {
  const std::vector<int> uses = use_counts(graph);
  std::vector<bool> erase(graph.nodes.size(), false);
  int fused = 0;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    Node& act = graph.nodes[i];
    if (act.op != OpKind::kActivation) continue;
    const int x = act.inputs[0];
    const int producer = graph.values[x].producer;
    if (producer < 0 || uses[x] != 1) continue;
    Node& lin = graph.nodes[producer];
    if (lin.op != OpKind::kLinear || lin.attr<LinearAttrs>().epilogue.activation) continue;
    const Activation fn = act.attr<ActivationAttrs>().activation;
    lin.attr<LinearAttrs>().epilogue.activation = fn;
    // The Linear now produces the activation's output value directly.
    const int out = act.outputs[0];
    graph.values[out].producer = producer;
    lin.outputs[0] = out;
    erase[i] = true;
    ++fused;
    log.debug("fuse_linear_activation: {} + {} ({})", lin.name, act.name, activation_name(fn));
  }
  if (fused == 0) return 0;
  remove_nodes(graph, erase);
  compact_values(graph);
  log.info("fuse_linear_activation[{}]: fused {} Linear+activation pairs", graph.name, fused);
  return fused;
}

}  // namespace kiln
