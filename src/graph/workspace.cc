#include "graph/workspace.h"

#include <algorithm>

namespace kiln {

namespace {

int64_t align(int64_t n) { return (n + kWorkspaceAlign - 1) / kWorkspaceAlign * kWorkspaceAlign; }

}  // namespace

WorkspaceLayout workspace_layout(const Graph& graph,
                                 const std::map<std::string, int64_t>& bindings) {
  const size_t nv = graph.values.size();
  WorkspaceLayout layout;
  layout.offset.assign(nv, -1);
  std::vector<int64_t> value_bytes(nv, 0);
  std::vector<int64_t> slot_bytes(static_cast<size_t>(std::max(graph.num_slots, 0)), 0);
  // Outputs with a slot are streamed (Graph::value_slot); the others have one of their own.
  auto slot_of = [&](size_t id) {
    return id < graph.value_slot.size() ? graph.value_slot[id] : -1;
  };
  for (size_t id = 0; id < nv; ++id) {
    const Value& v = graph.values[id];
    if (v.kind != ValueKind::kActivation) continue;
    value_bytes[id] = static_cast<int64_t>(
        dtype_bytes(v.dtype, static_cast<size_t>(shape_numel(resolve_shape(v.shape, bindings)))));
    layout.unplanned_bytes += value_bytes[id];
    if (const int s = slot_of(id); s >= 0) slot_bytes[s] = std::max(slot_bytes[s], value_bytes[id]);
  }
  std::vector<int64_t> slot_offset(slot_bytes.size());
  int64_t cursor = 0;
  for (size_t s = 0; s < slot_bytes.size(); ++s) {
    slot_offset[s] = cursor;
    cursor += align(slot_bytes[s]);
  }
  for (size_t id = 0; id < nv; ++id) {
    if (graph.values[id].kind != ValueKind::kActivation) continue;
    if (const int s = slot_of(id); s >= 0) {
      layout.offset[id] = slot_offset[s];
    } else {
      layout.offset[id] = cursor;
      cursor += align(value_bytes[id]);
    }
  }
  layout.bytes = cursor;
  return layout;
}

}  // namespace kiln
