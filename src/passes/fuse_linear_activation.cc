#include "passes/pass.h"

namespace kiln {
namespace {

std::vector<int> use_counts(const Graph& g) {
  std::vector<int> uses(g.values.size(), 0);
  for (const Node& n : g.nodes)
    for (int id : n.inputs)
      if (id >= 0) ++uses[id];
  for (int id : g.outputs) ++uses[id];
  return uses;
}

}  // namespace

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
    if (lin.op != OpKind::kLinear || lin.attrs.has_activation) continue;
    lin.attrs.has_activation = true;
    lin.attrs.activation = act.attrs.activation;
    // The Linear now produces the activation's output value directly.
    const int out = act.outputs[0];
    graph.values[out].producer = producer;
    lin.outputs[0] = out;
    erase[i] = true;
    ++fused;
    log.debug("fuse_linear_activation: {} + {} ({})", lin.name, act.name,
              activation_name(act.attrs.activation));
  }
  if (fused == 0) return 0;
  remove_nodes(graph, erase);
  compact_values(graph);
  log.info("fuse_linear_activation[{}]: fused {} Linear+activation pairs", graph.name, fused);
  return fused;
}

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
    add.attrs.eps = norm.attrs.eps;
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
