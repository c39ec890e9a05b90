// fp16 / bf16 plans on CUDA: every float weight and activation of a graph takes the plan's type,
// and the decoder's logits go back to f32 through one Cast at the end (sampling, log-softmax and
// beam scores read f32). What must stay wide stays wide inside the kernels: GEMMs accumulate in
// fp32, norms and softmax compute their statistics in fp32, attention keeps scores and its online
// softmax in fp32. Runs after constant folding (weights are concrete) and before plan_memory
// (buffer sizes depend on the types).
#include <algorithm>

#include "passes/pass.h"

namespace kiln {
namespace {

bool is_float(DType d) { return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16; }

}  // namespace

int narrow_graph(Graph& graph, Precision precision, const Logger& log) {
  DType narrow = DType::kF32;
  switch (precision) {
    case Precision::kFp32:
      return 0;
    case Precision::kFp16:
      narrow = DType::kF16;
      break;
    case Precision::kBf16:
      narrow = DType::kBF16;
      break;
    case Precision::kInt8:
    case Precision::kInt8Weight:
      KILN_FAIL("graph '{}': narrow_graph handles fp32, fp16 and bf16, not {}", graph.name,
                precision_name(precision));
  }
  int weights = 0, activations = 0;
  for (Value& v : graph.values) {
    if (!is_float(v.dtype) || v.dtype == narrow) continue;
    switch (v.kind) {
      case ValueKind::kWeight:
        KILN_CHECK(v.layout.plain(),
                   "graph '{}': weight '{}' is packed ({}); assign precision "
                   "before packing",
                   graph.name, v.name, v.layout.packing);
        v.data = v.data.to(narrow);
        v.dtype = narrow;
        ++weights;
        break;
      case ValueKind::kActivation:
        v.dtype = narrow;
        ++activations;
        break;
      case ValueKind::kInput:
        break;  // the graph contract's inputs are token ids and rows
    }
  }
  for (Node& n : graph.nodes)
    if (n.op == OpKind::kCast) n.attr<CastAttrs>().to = graph.values[n.outputs[0]].dtype;
  // The logits output, computed in the narrow type, widened to f32 by one Cast.
  const int logits = graph.find_value("logits");
  const auto out = std::find(graph.outputs.begin(), graph.outputs.end(), logits);
  if (logits >= 0 && out != graph.outputs.end() && graph.values[logits].dtype == narrow) {
    Value wide = graph.values[logits];
    graph.values[logits].name = "logits." + std::string(dtype_name(narrow));
    wide.dtype = DType::kF32;
    wide.producer = static_cast<int>(graph.nodes.size());
    const int wide_id = static_cast<int>(graph.values.size());
    graph.values.push_back(std::move(wide));
    graph.nodes.push_back(
        Node{OpKind::kCast, "logits_to_f32", {logits}, {wide_id}, CastAttrs{DType::kF32}});
    *out = wide_id;
  }
  log.info("graph '{}': {} precision: {} weights and {} activations in {}, logits in f32",
           graph.name, precision_name(precision), weights, activations, dtype_name(narrow));
  return weights + activations;
}

}  // namespace kiln
