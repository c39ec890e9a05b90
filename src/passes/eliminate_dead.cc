#include <numeric>

#include "passes/pass.h"

namespace kiln {

void compact_values(Graph& graph) {
  std::vector<bool> used(graph.values.size(), false);
  for (int id : graph.inputs) used[id] = true;
  for (int id : graph.outputs) used[id] = true;
  for (const Node& n : graph.nodes) {
    for (int id : n.inputs)
      if (id >= 0) used[id] = true;
    for (int id : n.outputs) used[id] = true;
  }
  std::vector<int> remap(graph.values.size(), -1);
  std::vector<Value> values;
  for (size_t i = 0; i < graph.values.size(); ++i) {
    if (!used[i]) continue;
    remap[i] = static_cast<int>(values.size());
    values.push_back(std::move(graph.values[i]));
  }
  graph.values = std::move(values);
  auto fix = [&](std::vector<int>& ids) {
    for (int& id : ids)
      if (id >= 0) id = remap[id];
  };
  fix(graph.inputs);
  fix(graph.outputs);
  for (Node& n : graph.nodes) {
    fix(n.inputs);
    fix(n.outputs);
  }
  graph.value_slot.clear();
  graph.num_slots = 0;
}

std::vector<int> use_counts(const Graph& graph) {
  std::vector<int> uses(graph.values.size(), 0);
  for (const Node& n : graph.nodes)
    for (int id : n.inputs)
      if (id >= 0) ++uses[id];
  for (int id : graph.outputs) ++uses[id];
  return uses;
}

void remove_nodes(Graph& graph, const std::vector<bool>& erase) {
  std::vector<Node> nodes;
  std::vector<int> new_index(graph.nodes.size(), -1);
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    if (erase[i]) continue;
    new_index[i] = static_cast<int>(nodes.size());
    nodes.push_back(std::move(graph.nodes[i]));
  }
  graph.nodes = std::move(nodes);
  for (Value& v : graph.values)
    if (v.kind == ValueKind::kActivation && v.producer >= 0) v.producer = new_index[v.producer];
}

int eliminate_dead(Graph& graph, const Logger& log) {
  std::vector<bool> live(graph.values.size(), false);
  for (int id : graph.outputs) live[id] = true;
  std::vector<bool> keep(graph.nodes.size(), false);
  for (size_t i = graph.nodes.size(); i-- > 0;) {
    const Node& n = graph.nodes[i];
    bool needed = false;
    for (int id : n.outputs) needed = needed || live[id];
    if (!needed) continue;
    keep[i] = true;
    for (int id : n.inputs)
      if (id >= 0) live[id] = true;
  }
  std::vector<bool> erase(keep.size());
  for (size_t i = 0; i < keep.size(); ++i) erase[i] = !keep[i];
  const size_t nodes_before = graph.nodes.size();
  remove_nodes(graph, erase);
  const int removed_nodes = static_cast<int>(nodes_before - graph.nodes.size());
  const size_t before = graph.values.size();
  int64_t weight_bytes_before = graph.weight_bytes();
  compact_values(graph);
  const int removed_values = static_cast<int>(before - graph.values.size());
  if (removed_nodes > 0 || removed_values > 0)
    log.info("eliminate_dead[{}]: removed {} nodes and {} values ({:.1f} MiB of weights)",
             graph.name, removed_nodes, removed_values,
             static_cast<double>(weight_bytes_before - graph.weight_bytes()) / (1 << 20));
  return removed_nodes + removed_values;
}

}  // namespace kiln
