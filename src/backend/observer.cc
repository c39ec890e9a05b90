#include "backend/observer.h"

#include <algorithm>

namespace kiln {

std::vector<uint8_t> observed_nodes(const Graph& graph, const ObserverSelection& selection) {
  for (const std::string& name : selection.names)
    KILN_CHECK(std::any_of(graph.nodes.begin(), graph.nodes.end(),
                           [&](const Node& n) { return n.name == name; }),
               "graph '{}': no node named '{}' to observe", graph.name, name);
  std::vector<uint8_t> out(graph.nodes.size(), 0);
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& n = graph.nodes[i];
    const bool chosen =
        std::find(selection.ops.begin(), selection.ops.end(), n.op) != selection.ops.end() ||
        std::find(selection.names.begin(), selection.names.end(), n.name) != selection.names.end();
    if (!chosen) continue;
    const std::vector<int>& slots = selection.side == ObservedSide::kInput ? n.inputs : n.outputs;
    KILN_CHECK(selection.slot >= 0 && static_cast<size_t>(selection.slot) < slots.size() &&
                   slots[static_cast<size_t>(selection.slot)] >= 0,
               "graph '{}': node '{}' ({}) has no {} {} to observe", graph.name, n.name,
               op_name(n.op), selection.side == ObservedSide::kInput ? "input" : "output",
               selection.slot);
    out[i] = 1;
  }
  return out;
}

std::vector<std::string> names_in_graph(const Graph& graph, const std::vector<std::string>& names) {
  std::vector<std::string> out;
  for (const std::string& name : names)
    if (std::any_of(graph.nodes.begin(), graph.nodes.end(),
                    [&](const Node& n) { return n.name == name; }))
      out.push_back(name);
  return out;
}

void ObserverState::set(const Graph& graph, ActivationObserver observer) {
  observed_ = observer.active() ? observed_nodes(graph, observer.selection)
                                : std::vector<uint8_t>(graph.nodes.size(), 0);
  observer_ = std::move(observer);
  step_ = -1;
}

void ObserverState::report(const Graph& graph, size_t node, const Tensor& value) const {
  const Node& n = graph.nodes[node];
  observer_.callback(Observation{graph, static_cast<int>(node), n.name, step_, value});
}

}  // namespace kiln
