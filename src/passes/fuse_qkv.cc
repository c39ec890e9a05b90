// Self attention's three projections of one input → one Linear over the three weights stacked
// ([3·inner, d] as q, k, v) feeding a packed_qkv Attention (BLOOM's layout). On the CPU a
// batch-1 decode step runs each Linear as one short pool job with its weight streams starting
// cold: on flan-t5-base int8-weight the 768 × 768 projections took ~15 us each against ~10 us
// for their bytes at the machine's rate, and the three of a layer in one call stream as one
// weight. On CUDA a decode step is a chain of dependent kernels, each a few microseconds of
// latency: one GEMV instead of three per T5 layer (and one GEMM instead of three in prefill).
//
// Each output is still the same dot product of the same weight row with the same input row, so
// results are unchanged on the CPU's panel kernel (one chain per output over the input in
// order, bit for bit). Runs before assign_precision: per-output-channel quantization of the
// stacked rows gives every row the scale it had alone.
#include <cstring>

#include "passes/pass.h"

namespace kiln {
namespace {

// The plain weight [out, in] of the Linear producing `value` if this pass can stack it: x · wᵀ
// with no bias, scales, residual or activation, its output read once (by the attention); -1
// otherwise.
int stackable_weight(const Graph& g, int value, const std::vector<int>& uses) {
  if (value < 0 || uses[value] != 1) return -1;
  const int producer = g.values[value].producer;
  if (producer < 0) return -1;
  const Node& lin = g.nodes[producer];
  if (lin.op != OpKind::kLinear || lin.attr<LinearAttrs>().activation) return -1;
  for (size_t i = 2; i < lin.inputs.size(); ++i)
    if (lin.inputs[i] >= 0) return -1;
  const int w = lin.inputs[1];
  const Value& wv = g.values[w];
  if (wv.kind != ValueKind::kWeight || !wv.data.defined() || wv.data.dtype() != wv.dtype ||
      !wv.layout.plain() || wv.data.rank() != 2 || !wv.data.is_contiguous())
    return -1;
  return w;
}

// "….SelfAttention.q" -> "….SelfAttention.qkv".
std::string stacked_name(const std::string& q_linear) {
  if (q_linear.size() > 2 && q_linear.ends_with(".q")) return q_linear + "kv";
  return q_linear + ".qkv";
}

}  // namespace

int fuse_qkv(Graph& graph, const Logger& log) {
  const std::vector<int> uses = use_counts(graph);
  std::vector<bool> erase(graph.nodes.size(), false);
  int fused = 0;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& attn = graph.nodes[i];
    if (attn.op != OpKind::kAttention) continue;
    const AttentionAttrs& a = attn.attr<AttentionAttrs>();
    if (a.packed_qkv || a.kind == AttentionKind::kCross || attn.inputs.size() < 3) continue;
    int w[3];
    bool ok = true;
    for (int j = 0; j < 3 && ok; ++j) {
      w[j] = stackable_weight(graph, attn.inputs[j], uses);
      ok = w[j] >= 0;
    }
    if (!ok) continue;
    const int lin[3] = {graph.values[attn.inputs[0]].producer,
                        graph.values[attn.inputs[1]].producer,
                        graph.values[attn.inputs[2]].producer};
    const int x = graph.nodes[lin[0]].inputs[0];
    const Tensor& wq = graph.values[w[0]].data;
    const int64_t rows = wq.dim(0), cols = wq.dim(1);
    if (rows != static_cast<int64_t>(a.num_heads) * a.head_dim) continue;
    for (int j = 1; j < 3; ++j) {
      const Tensor& wj = graph.values[w[j]].data;
      ok = ok && graph.nodes[lin[j]].inputs[0] == x && wj.dtype() == wq.dtype() &&
           wj.dim(0) == rows && wj.dim(1) == cols;
    }
    if (!ok) continue;
    // The stacked weight [3·inner, d]: q's rows, then k's, then v's (packed_qkv's [3, H, dh]).
    Tensor stacked = Tensor::empty(wq.dtype(), {3 * rows, cols});
    char* dst = static_cast<char*>(stacked.raw());
    for (int j = 0; j < 3; ++j) {
      const Tensor& wj = graph.values[w[j]].data;
      std::memcpy(dst + j * wj.nbytes(), wj.raw(), wj.nbytes());
    }
    Node& q = graph.nodes[lin[0]];
    const std::string name = stacked_name(q.name);
    const int weight_id = graph.add_weight(name + ".weight", std::move(stacked));
    // The q Linear becomes the stacked one (it comes first, and x exists by then); its output
    // value widens to [tokens, 3·inner].
    Node& stacked_linear = graph.nodes[lin[0]];
    stacked_linear.inputs[1] = weight_id;
    stacked_linear.name = name;
    const int out = stacked_linear.outputs[0];
    graph.values[out].shape.back() = Dim::of(3 * rows);
    graph.values[out].name = name;
    Node& at = graph.nodes[i];
    at.inputs.erase(at.inputs.begin() + 1, at.inputs.begin() + 3);
    at.attr<AttentionAttrs>().packed_qkv = true;
    erase[lin[1]] = erase[lin[2]] = true;
    ++fused;
    log.debug("fuse_qkv: {} reads {}", at.name, name);
  }
  if (fused == 0) return 0;
  remove_nodes(graph, erase);
  compact_values(graph);
  log.info("fuse_qkv[{}]: stacked q/k/v into one Linear for {} attentions", graph.name, fused);
  return fused;
}

}  // namespace kiln
