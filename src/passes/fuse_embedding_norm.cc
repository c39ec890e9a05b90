// An embedding gather and the LayerNorm of its rows as one node (CUDA plans): BLOOM normalizes
// the embedded tokens (word_embeddings_layernorm) before the first layer. As two kernels, a decode
// step began with a gather of one row and a norm of it, each waiting for the one before; the
// LayerNorm with a rows input reads table[ids] itself. Fused only when the norm is the only
// reader of the gathered rows (not a graph output), the table is a float table (no i8 scales)
// of the norm's type, so that the gathered rows were the table's own values.
#include "passes/pass.h"

namespace kiln {

int fuse_embedding_norm(Graph& graph, const Logger& log) {
  const std::vector<int> uses = use_counts(graph);
  std::vector<bool> erase(graph.nodes.size(), false);
  int fused = 0;
  for (Node& norm : graph.nodes) {
    if (norm.op != OpKind::kLayerNorm || norm.inputs.size() != 3) continue;
    const int e = norm.inputs[0];
    const int producer = graph.values[e].producer;
    if (producer < 0 || uses[e] != 1) continue;
    const Node& emb = graph.nodes[producer];
    if (emb.op != OpKind::kEmbedding || emb.inputs.size() != 2) continue;
    const int table = emb.inputs[0];
    if (graph.values[table].dtype != graph.values[e].dtype ||
        graph.values[norm.outputs[0]].dtype != graph.values[e].dtype)
      continue;
    norm.inputs = {table, norm.inputs[1], norm.inputs[2], emb.inputs[1]};
    graph.values[e].producer = -1;
    erase[producer] = true;
    log.debug("fuse_embedding_norm: {} gathers and normalizes in {}", emb.name, norm.name);
    ++fused;
  }
  if (fused == 0) return 0;
  remove_nodes(graph, erase);
  compact_values(graph);
  log.info("fuse_embedding_norm[{}]: {} embedding gathers fused into their LayerNorms", graph.name,
           fused);
  return fused;
}

}  // namespace kiln
