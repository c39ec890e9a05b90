// The GatherRows before the lm_head, inside it (CUDA plans). Both frontends gather the rows that
// need logits (each sequence's last token) before the final norm and the lm_head; once the norm
// is folded into the lm_head (fuse_norm_linear), a decode step copied its one row in a kernel of
// its own, waited for by the lm_head (3.4 µs of the chain on the H200). The Linear with a rows
// operand (LinearOperand::kRows) reads x[rows] itself: the one-row GEMV offsets its input by the
// row, other steps gather into the node's scratch first. Fused only when the gathered rows have one
// reader, a Linear reading them as its input, with no fused residual.
#include "passes/pass.h"

namespace kiln {

int fuse_gather_linear(Graph& graph, const Logger& log) {
  const std::vector<int> uses = use_counts(graph);
  std::vector<bool> erase(graph.nodes.size(), false);
  int fused = 0;
  for (Node& lin : graph.nodes) {
    if (lin.op != OpKind::kLinear) continue;
    const LinearDesc d = describe_linear(lin);
    const int g = d.operand(LinearOperand::kX);
    const int producer = graph.values[g].producer;
    if (producer < 0 || uses[g] != 1 || graph.nodes[producer].op != OpKind::kGatherRows) continue;
    if (d.has(LinearOperand::kResidual) || d.has(LinearOperand::kRows)) continue;
    const Node& gather = graph.nodes[producer];
    if (graph.values[gather.inputs[0]].shape.size() != 2) continue;
    set_linear_operand(lin, LinearOperand::kX, gather.inputs[0]);
    set_linear_operand(lin, LinearOperand::kRows, gather.inputs[1]);
    graph.values[g].producer = -1;
    erase[producer] = true;
    log.debug("fuse_gather_linear: {} reads the rows {} gathered", lin.name, gather.name);
    ++fused;
  }
  if (fused == 0) return 0;
  remove_nodes(graph, erase);
  compact_values(graph);
  log.info("fuse_gather_linear[{}]: {} linears read their rows themselves (gathers removed)",
           graph.name, fused);
  return fused;
}

}  // namespace kiln
