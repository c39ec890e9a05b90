// Where each activation of a graph lives inside one workspace (arena) for given symbol bindings.
// The plan_memory pass decides which values share a slot (lifetimes that do not overlap); this
// turns slots into byte offsets. Backends allocate exactly `bytes` once per shape bucket, the
// build log and `kiln inspect` report the same number: there is one computation.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "graph/ir.h"

namespace kiln {

inline constexpr int64_t kWorkspaceAlign = 64;

struct WorkspaceLayout {
  // Byte offset of every value in the arena; -1 for inputs and weights (they live elsewhere).
  std::vector<int64_t> offset;
  int64_t bytes = 0;            // arena size: slots + graph outputs + unpooled activations
  int64_t unplanned_bytes = 0;  // what one buffer per activation would need (for comparison)
};

// Every activation gets its slot's region (sized to the slot's largest member); graph outputs
// and activations without a slot get a region of their own. Regions are 64-byte aligned.
WorkspaceLayout workspace_layout(const Graph& graph,
                                 const std::map<std::string, int64_t>& bindings);

}  // namespace kiln
