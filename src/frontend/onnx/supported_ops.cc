#include "frontend/onnx/supported_ops.h"

#include <algorithm>
#include <array>
#include <map>

namespace kiln {
namespace {

// Issue 41's list of what the torch exporters emit for T5 and BLOOM ("at least"), plus Identity,
// which the TorchScript exports in ../shared/fixtures/onnx use, and Reciprocal, which the dynamo
// exporter writes for T5's rsqrt (inference-mode Dropout becomes Identity on import:
// import_graph.h). Sorted: binary search.
// clang-format off
constexpr std::array<std::string_view, 50> kSupportedOps = {
    "Abs", "Add", "And", "Cast", "Clip", "Concat", "Constant", "ConstantOfShape", "CumSum", "Div", "Equal",
    "Erf", "Expand", "Flatten", "Gather", "GatherND", "Gemm", "Greater", "GreaterOrEqual",
    "Identity", "IsInf", "LayerNormalization", "Less", "LessOrEqual", "Log", "MatMul", "Max", "Min", "Mul",
    "Neg", "Not", "Pow", "Range", "Reciprocal", "ReduceMean", "ReduceSum", "Relu", "Reshape", "Shape", "Slice", "Softmax",
    "Split", "Sqrt", "Squeeze", "Sub", "Tanh", "Transpose", "Trilu", "Unsqueeze", "Where",
};
// clang-format on
static_assert(std::is_sorted(kSupportedOps.begin(), kSupportedOps.end()));

}  // namespace

std::span<const std::string_view> supported_onnx_ops() { return kSupportedOps; }

bool is_supported_onnx_op(const ImportNode& node) {
  return node.domain.empty() &&
         std::binary_search(kSupportedOps.begin(), kSupportedOps.end(), node.op_type);
}

std::vector<UnsupportedOp> find_unsupported_ops(const ImportGraph& graph) {
  std::vector<UnsupportedOp> found;
  for (int n : graph.order()) {
    const ImportNode& node = graph.nodes()[n];
    if (!is_supported_onnx_op(node)) found.push_back({node.name, node.qualified_op()});
  }
  return found;
}

void check_supported_ops(const ImportGraph& graph) {
  const std::vector<UnsupportedOp> found = find_unsupported_ops(graph);
  if (found.empty()) return;
  std::map<std::string, std::vector<std::string>> by_op;
  for (const UnsupportedOp& u : found) by_op[u.op].push_back(u.node);
  std::string list;
  for (const auto& [op, nodes] : by_op)
    list += fmt::format("\n  {} ({} node{}): {}", op, nodes.size(), nodes.size() == 1 ? "" : "s",
                        fmt::join(nodes, ", "));
  // A Dropout left after import is in training mode (or its mask is read): the export was made
  // from a module in train(), which onnxruntime runs with random drops too.
  if (by_op.count("Dropout"))
    list +=
        "\n  (a Dropout that stays is in training mode or has its mask read: export the model "
        "after model.eval(), whose Dropouts kiln imports as the identity)";
  KILN_FAIL("{}: {} node{} use{} ops kiln does not import:{}", graph.path(), found.size(),
            found.size() == 1 ? "" : "s", found.size() == 1 ? "s" : "", list);
}

}  // namespace kiln
