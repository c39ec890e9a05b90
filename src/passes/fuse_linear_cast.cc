// The Cast that widens a narrow Linear's output to f32, inside the Linear (CUDA fp16 / bf16
// plans). narrow_graph computes the logits in the plan's type and widens them with a Cast: at
// batch 1 a kernel of its own after the lm_head, on the chain of kernels between two decode
// steps (2.4 µs past the lm_head on the H200); T5's fp16 plans also widen the fp16 Linears'
// outputs that join their f32 residual stream. With LinearEpilogue::widen the Linear stores its
// output, rounded to its type as before, as f32 itself: the same numbers. Fused only when the
// Cast is the Linear's only reader and the Linear has no fused residual.
#include "passes/pass.h"

namespace kiln {

int fuse_linear_cast(Graph& graph, const Logger& log) {
  const std::vector<int> uses = use_counts(graph);
  std::vector<bool> erase(graph.nodes.size(), false);
  int fused = 0;
  for (size_t c = 0; c < graph.nodes.size(); ++c) {
    const Node& cast = graph.nodes[c];
    if (cast.op != OpKind::kCast || cast.attr<CastAttrs>().to != DType::kF32) continue;
    const int narrow = cast.inputs[0];
    const int producer = graph.values[narrow].producer;
    if (producer < 0 || uses[narrow] != 1) continue;
    Node& lin = graph.nodes[producer];
    const DType t = graph.values[narrow].dtype;
    if (lin.op != OpKind::kLinear || (t != DType::kF16 && t != DType::kBF16)) continue;
    const LinearDesc d = describe_linear(lin);
    if (d.has(LinearOperand::kResidual) || graph.values[d.operand(LinearOperand::kX)].dtype != t)
      continue;
    const int wide = cast.outputs[0];
    lin.attr<LinearAttrs>().epilogue.widen = true;
    lin.outputs[0] = wide;
    graph.values[wide].producer = producer;
    graph.values[narrow].producer = -1;
    erase[c] = true;
    log.debug("fuse_linear_cast: {} stores {} as f32", lin.name, graph.values[wide].name);
    ++fused;
  }
  if (fused == 0) return 0;
  remove_nodes(graph, erase);
  compact_values(graph);
  log.info("fuse_linear_cast[{}]: {} linears store their output as f32 (their casts removed)",
           graph.name, fused);
  return fused;
}

}  // namespace kiln
