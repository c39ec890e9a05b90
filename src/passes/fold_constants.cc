#include <cstring>

#include "graph/op_registry.h"
#include "passes/pass.h"

namespace kiln {
namespace {

bool all_inputs_constant(const Graph& g, const Node& n) {
  for (int id : n.inputs)
    if (id >= 0 && g.values[id].kind != ValueKind::kWeight) return false;
  return !n.inputs.empty();
}

// Returns an undefined tensor when the op is not folded here.
Tensor evaluate(const Graph& g, const Node& n) {
  auto as_f32 = [&](int i) { return g.values[n.inputs[i]].data.to_f32(); };
  switch (n.op) {
    case OpKind::kCast:
      return g.values[n.inputs[0]].data.to(n.attr<CastAttrs>().to);
    case OpKind::kScale: {
      Tensor x = as_f32(0);
      float* p = x.data<float>();
      const float factor = n.attr<ScaleAttrs>().scale;
      for (int64_t i = 0; i < x.numel(); ++i) p[i] *= factor;
      return x.to(g.values[n.inputs[0]].dtype);
    }
    case OpKind::kAdd:
    case OpKind::kMul: {
      Tensor a = as_f32(0);
      const Tensor b = as_f32(1);
      float* pa = a.data<float>();
      const float* pb = b.data<float>();
      for (int64_t i = 0; i < a.numel(); ++i)
        pa[i] = n.op == OpKind::kAdd ? pa[i] + pb[i] : pa[i] * pb[i];
      return a.to(g.values[n.inputs[0]].dtype);
    }
    case OpKind::kEmbedding:
    case OpKind::kLinear:
    case OpKind::kRmsNorm:
    case OpKind::kLayerNorm:
    case OpKind::kActivation:
    case OpKind::kGatedActivation:
    case OpKind::kSoftmax:
    case OpKind::kAttention:
    case OpKind::kGatherRows:
    case OpKind::kAddRmsNorm:
      return {};
  }
  return {};
}

}  // namespace

int fold_constants(Graph& graph, const Logger& log) {
  int folded = 0;
  int64_t bytes = 0;
  std::vector<bool> erase(graph.nodes.size(), false);
  // A node nobody reads is left to eliminate_dead: folding it would make a weight only to drop
  // it (keep_narrow_weights leaves the widening Casts of a whole checkpoint unread; evaluated,
  // they were twice the model's bytes in f32, converted and spilled for nothing).
  const std::vector<int> uses = use_counts(graph);
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    Node& n = graph.nodes[i];
    if (n.outputs.size() == 1 && uses[n.outputs[0]] > 0 && all_inputs_constant(graph, n)) {
      Tensor result = evaluate(graph, n);
      if (result.defined()) {
        Value& out = graph.values[n.outputs[0]];
        out.kind = ValueKind::kWeight;
        out.producer = -1;
        graph.set_weight_data(n.outputs[0], std::move(result));
        for (int in : n.inputs)
          if (in >= 0) graph.values[in].data.release_pages();
        bytes += static_cast<int64_t>(out.data.nbytes());
        ++folded;
        log.debug("fold_constants: {} '{}' → constant {}", op_name(n.op), n.name, out.name);
        erase[i] = true;
      }
    }
  }
  remove_nodes(graph, erase);
  if (folded > 0)
    log.info("fold_constants[{}]: folded {} nodes into constants ({:.1f} MiB)", graph.name, folded,
             static_cast<double>(bytes) / (1 << 20));
  return folded;
}

}  // namespace kiln
