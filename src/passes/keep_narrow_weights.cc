// CUDA fp16 / bf16 plans from a checkpoint stored in the plan's own type: the frontend widens
// every weight to f32 through a Cast (graph/builder.h: weight_f32), constant folding would turn
// each into an f32 copy, and narrow_graph would round it back to the same bytes. For a 7B model
// that is 28 GB of f32 written to the build's spill file and read back for nothing. This pass,
// run before folding, lets the Linears and Embeddings that narrow_graph would narrow read the
// checkpoint's tensor itself (a mapping of the safetensors file, never resident):
//
//   Linear(x, Cast(w16 -> f32))    -> Linear(x, w16)          (an f32 x with a narrow weight
//                                                              is a valid Linear; narrow_graph
//                                                              narrows x later)
//   Embedding(Cast(t16 -> f32), i) -> Cast(Embedding(t16, i) -> f32)
//
// The f16 -> f32 -> f16 round trip is exact, so the plan's bytes are the same. Weights that
// narrow_graph keeps in f32 (T5's fp16 `wo`) are widened there from the narrow tensor, and the
// Embedding's Cast becomes an identity that narrow_graph removes. Other readers of a widened
// weight (constant folding's Scale/Add/Mul) keep their Cast.
#include <utility>
#include <vector>

#include "passes/pass.h"

namespace kiln {
namespace {

// The weight that Cast node `n` widens to f32 when it is `narrow`, or -1.
int widened_narrow_weight(const Graph& g, const Node& n, DType narrow) {
  if (n.op != OpKind::kCast || n.inputs.size() != 1 || n.outputs.size() != 1) return -1;
  const int w = n.inputs[0];
  if (w < 0 || g.values[w].kind != ValueKind::kWeight || g.values[w].dtype != narrow) return -1;
  return n.attr<CastAttrs>().to == DType::kF32 ? w : -1;
}

}  // namespace

int keep_narrow_weights(Graph& graph, DType narrow, const Logger& log) {
  if (narrow != DType::kF16 && narrow != DType::kBF16) return 0;
  std::vector<int> narrow_of(graph.values.size(), -1);  // widened value -> its narrow weight
  for (const Node& n : graph.nodes) {
    const int w = widened_narrow_weight(graph, n, narrow);
    if (w >= 0) narrow_of[n.outputs[0]] = w;
  }
  int linears = 0, embeddings = 0;
  int64_t bytes = 0;
  std::vector<bool> counted(graph.values.size(), false);
  auto count = [&](int w) {
    if (counted[w]) return;
    counted[w] = true;
    bytes += static_cast<int64_t>(graph.values[w].data.nbytes());
  };
  std::vector<Node> nodes;
  nodes.reserve(graph.nodes.size());
  for (Node& n : graph.nodes) {
    if (n.op == OpKind::kLinear && n.has_input(1) && narrow_of[n.inputs[1]] >= 0) {
      n.inputs[1] = narrow_of[n.inputs[1]];
      count(n.inputs[1]);
      ++linears;
    }
    const bool embedding = n.op == OpKind::kEmbedding && n.has_input(0) &&
                           narrow_of[n.inputs[0]] >= 0 && n.outputs.size() == 1;
    if (!embedding) {
      nodes.push_back(std::move(n));
      continue;
    }
    // The Embedding gathers narrow rows; a Cast after it gives its readers the f32 they read.
    n.inputs[0] = narrow_of[n.inputs[0]];
    count(n.inputs[0]);
    const int rows = n.outputs[0];
    Value wide = graph.values[rows];
    graph.values[rows].dtype = narrow;
    graph.values[rows].name += "." + std::string(dtype_name(narrow));
    const int wide_id = static_cast<int>(graph.values.size());
    graph.values.push_back(std::move(wide));
    narrow_of.push_back(-1);
    counted.push_back(false);
    // Every later reader of the rows (and the graph's outputs) reads the widened value.
    for (Node& later : graph.nodes)
      for (int& in : later.inputs)
        if (in == rows) in = wide_id;
    for (int& out : graph.outputs)
      if (out == rows) out = wide_id;
    Node cast{OpKind::kCast, n.name + ".f32", {rows}, {wide_id}, CastAttrs{DType::kF32}};
    nodes.push_back(std::move(n));
    nodes.push_back(std::move(cast));
    ++embeddings;
  }
  graph.nodes = std::move(nodes);
  for (size_t i = 0; i < graph.nodes.size(); ++i)
    for (int out : graph.nodes[i].outputs) graph.values[out].producer = static_cast<int>(i);
  if (linears + embeddings > 0)
    log.info(
        "graph '{}': {} Linears and {} Embeddings read the checkpoint's {} weights as they are "
        "({:.1f} MiB not widened to f32 and narrowed back)",
        graph.name, linears, embeddings, dtype_name(narrow),
        static_cast<double>(bytes) / (1 << 20));
  return linears + embeddings;
}

}  // namespace kiln
