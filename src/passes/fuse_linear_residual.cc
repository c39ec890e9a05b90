// Residual adds into the Linear before them (CUDA plans): y = Add(r, Linear(x)) becomes
// y = Linear(x, ..., residual = r), one kernel instead of two and one round trip of the
// activations less per add (BLOOM's attention output and FFN down projections: two per layer).
// The Linear rounds its own result before adding, as the Add did, so the numbers do not change.
// Runs before plan_memory: the planner then sees the residual as an input of the Linear, and
// never gives the output the buffer of an input the Linear still reads.
#include "passes/pass.h"

namespace kiln {

int fuse_linear_residual(Graph& graph, const Logger& log) {
  const std::vector<int> uses = use_counts(graph);
  std::vector<bool> erase(graph.nodes.size(), false);
  int fused = 0;
  for (size_t j = 0; j < graph.nodes.size(); ++j) {
    const Node& add = graph.nodes[j];
    if (add.op != OpKind::kAdd || add.inputs.size() != 2) continue;
    for (int side = 0; side < 2; ++side) {
      const int o = add.inputs[side], r = add.inputs[1 - side], s = add.outputs[0];
      if (o < 0 || r < 0 || uses[o] != 1) continue;
      const int i = graph.values[o].producer;
      if (i < 0 || erase[i]) continue;
      Node& lin = graph.nodes[i];
      if (lin.op != OpKind::kLinear) continue;
      const LinearDesc d = describe_linear(lin);
      if (d.epilogue.activation || d.has(LinearOperand::kResidual)) continue;
      const Value &vo = graph.values[o], &vr = graph.values[r], &vs = graph.values[s];
      if (vo.dtype != vs.dtype || vr.dtype != vs.dtype || vo.shape != vs.shape) continue;
      // The residual must exist when the Linear runs.
      const int rp = vr.producer;
      if (vr.kind == ValueKind::kActivation && (rp < 0 || rp >= static_cast<int>(i))) continue;
      set_linear_operand(lin, LinearOperand::kResidual, r);
      lin.outputs[0] = s;
      graph.values[s].producer = i;
      erase[j] = true;
      ++fused;
      log.debug("fuse_linear_residual: {} + {}", lin.name, add.name);
      break;
    }
  }
  if (fused == 0) return 0;
  remove_nodes(graph, erase);
  compact_values(graph);
  log.info("fuse_linear_residual[{}]: fused {} residual adds into the linears before them",
           graph.name, fused);
  return fused;
}

}  // namespace kiln
