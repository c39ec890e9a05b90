// The ONNX ops kiln's import reads (issue 41: what torch's TorchScript and dynamo exporters emit
// for T5 and BLOOM), and the check that reports every other op of a graph at once.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "frontend/onnx/import_graph.h"

namespace kiln {

// Default-domain op types, sorted.
std::span<const std::string_view> supported_onnx_ops();
bool is_supported_onnx_op(const ImportNode& node);

struct UnsupportedOp {
  std::string node;  // node name
  std::string op;    // qualified op type ("com.microsoft::Attention")
};
// Every node whose op kiln does not import, in the graph's order.
std::vector<UnsupportedOp> find_unsupported_ops(const ImportGraph& graph);
// Throws one kiln::Error listing every unsupported node (op type and node name), grouped by op.
void check_supported_ops(const ImportGraph& graph);

}  // namespace kiln
