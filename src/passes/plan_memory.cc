// Activation memory planning: values whose lifetimes do not overlap share a buffer slot. Sizes
// depend on the step's symbol bindings, so the plan fixes slot membership at build time and
// workspace_layout() turns slots into offsets for each shape bucket.
#include <algorithm>

#include "graph/workspace.h"
#include "passes/pass.h"

namespace kiln {
namespace {

bool pooled(const Graph& g, int id, const std::vector<bool>& is_output) {
  return g.values[id].kind == ValueKind::kActivation && !is_output[id];
}

}  // namespace

void plan_memory(Graph& graph, const Logger& log,
                 const std::map<std::string, int64_t>& report_bindings) {
  const int nv = static_cast<int>(graph.values.size());
  std::vector<bool> is_output(nv, false);
  for (int id : graph.outputs) is_output[id] = true;
  std::vector<int> last_use(nv, -1);
  for (size_t n = 0; n < graph.nodes.size(); ++n)
    for (int id : graph.nodes[n].inputs)
      if (id >= 0) last_use[id] = static_cast<int>(n);

  graph.value_slot.assign(nv, -1);
  std::vector<int> free_slots;
  std::vector<std::vector<int>> dying_at(graph.nodes.size() + 1);
  int num_slots = 0;
  for (size_t n = 0; n < graph.nodes.size(); ++n) {
    const Node& node = graph.nodes[n];
    for (int id : node.outputs) {
      if (!pooled(graph, id, is_output)) continue;
      int slot;
      if (!free_slots.empty()) {
        slot = free_slots.back();
        free_slots.pop_back();
      } else {
        slot = num_slots++;
      }
      graph.value_slot[id] = slot;
      // A value nobody reads dies right after it is written.
      const int dies = std::max(last_use[id], static_cast<int>(n));
      dying_at[dies].push_back(id);
    }
    // Slots are released after the node runs, so no node writes into a buffer it is reading.
    for (int id : dying_at[n]) free_slots.push_back(graph.value_slot[id]);
  }
  graph.num_slots = num_slots;
  const WorkspaceLayout r = workspace_layout(graph, report_bindings);
  std::string where;
  for (const auto& [k, v] : report_bindings) where += fmt::format(" {}={}", k, v);
  log.info(
      "plan_memory[{}]: {} activations in {} slots; at{}: {:.1f} KiB (vs {:.1f} KiB unplanned)",
      graph.name,
      std::count_if(graph.value_slot.begin(), graph.value_slot.end(), [](int s) { return s >= 0; }),
      num_slots, where, static_cast<double>(r.bytes) / 1024,
      static_cast<double>(r.unplanned_bytes) / 1024);
}

}  // namespace kiln
