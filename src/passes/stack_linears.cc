// Stacking Linears that read one input into one Linear: fuse_qkv and fuse_gate_up.
//
// fuse_qkv: self attention's three projections of one input → one Linear over the three
// weights stacked ([3·inner, d] as q, k, v) feeding a packed_qkv Attention (BLOOM's layout). On
// the CPU a batch-1 decode step runs each Linear as one short pool job with its weight streams
// starting cold: on flan-t5-base int8-weight the 768 × 768 projections took ~15 us each against
// ~10 us for their bytes at the machine's rate, and the three of a layer in one call stream as
// one weight. On CUDA a decode step is a chain of dependent kernels, each a few microseconds of
// latency: one GEMV instead of three per T5 layer (and one GEMM instead of three in prefill).
//
// Each output is still the same dot product of the same weight row with the same input row, so
// results are unchanged on the CPU's panel kernel (one chain per output over the input in
// order, bit for bit). Runs before assign_precision: per-output-channel quantization of the
// stacked rows gives every row the scale it had alone.
//
// fuse_gate_up does the same for a gated feed-forward's two projections of one input (T5's
// wi_0 and wi_1): one Linear over [gate; up] feeding a GatedActivation that reads the packed
// [n, 2f] rows.
#include <cstring>
#include <span>

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
  if (lin.op != OpKind::kLinear) return -1;
  // x · wᵀ and nothing else: no fused extra of any kind.
  const LinearDesc d = describe_linear(lin);
  if (!d.extras().empty()) return -1;
  const int w = d.operand(LinearOperand::kWeight);
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

// Whether the Linears lin (weights w, each stackable_weight's) all read lin[0]'s input with
// weights of one dtype and shape.
bool same_input_and_shape(const Graph& g, std::span<const int> lin, std::span<const int> w) {
  const int x = g.nodes[lin[0]].inputs[0];
  const Tensor& w0 = g.values[w[0]].data;
  for (size_t j = 1; j < lin.size(); ++j) {
    const Tensor& wj = g.values[w[j]].data;
    if (g.nodes[lin[j]].inputs[0] != x || wj.dtype() != w0.dtype() || wj.dim(0) != w0.dim(0) ||
        wj.dim(1) != w0.dim(1))
      return false;
  }
  return true;
}

// lin[0] becomes one Linear named `name` over the weights w stacked in order ([k·rows, cols]: the
// first's rows, then the second's, ...); its output widens to k·rows. The other Linears are left
// for the caller to erase.
void stack_into_first(Graph& g, std::span<const int> lin, std::span<const int> w,
                      const std::string& name) {
  const Tensor& w0 = g.values[w[0]].data;
  const int64_t k = static_cast<int64_t>(w.size()), rows = w0.dim(0), cols = w0.dim(1);
  Tensor stacked = Tensor::empty(w0.dtype(), {k * rows, cols});
  char* dst = static_cast<char*>(stacked.raw());
  for (int64_t j = 0; j < k; ++j) {
    const Tensor& wj = g.values[w[j]].data;
    std::memcpy(dst + j * wj.nbytes(), wj.raw(), wj.nbytes());
    wj.release_pages();
  }
  const int weight_id = g.add_weight(name + ".weight", std::move(stacked));
  Node& first = g.nodes[lin[0]];
  first.inputs[1] = weight_id;
  first.name = name;
  const int out = first.outputs[0];
  g.values[out].shape.back() = Dim::of(k * rows);
  g.values[out].name = name;
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
    if (graph.values[w[0]].data.dim(0) != static_cast<int64_t>(a.num_heads) * a.head_dim ||
        !same_input_and_shape(graph, lin, w))
      continue;
    // The stacked weight [3·inner, d]: q's rows, then k's, then v's (packed_qkv's [3, H, dh]).
    // The q Linear becomes the stacked one (it comes first, and x exists by then).
    const std::string name = stacked_name(graph.nodes[lin[0]].name);
    stack_into_first(graph, lin, w, name);
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

int fuse_gate_up(Graph& graph, const Logger& log) {
  const std::vector<int> uses = use_counts(graph);
  std::vector<bool> erase(graph.nodes.size(), false);
  int fused = 0;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const Node& gated = graph.nodes[i];
    if (gated.op != OpKind::kGatedActivation || gated.inputs.size() != 2) continue;
    const int w[2] = {stackable_weight(graph, gated.inputs[0], uses),
                      stackable_weight(graph, gated.inputs[1], uses)};
    if (w[0] < 0 || w[1] < 0) continue;
    const int lin[2] = {graph.values[gated.inputs[0]].producer,
                        graph.values[gated.inputs[1]].producer};
    if (lin[0] == lin[1] || !same_input_and_shape(graph, lin, w)) continue;
    // "….DenseReluDense.wi_0" -> "….DenseReluDense.wi"; else "<gate>.gate_up".
    const std::string& gate = graph.nodes[lin[0]].name;
    const std::string name =
        gate.ends_with("_0") ? gate.substr(0, gate.size() - 2) : gate + ".gate_up";
    stack_into_first(graph, lin, w, name);
    Node& g = graph.nodes[i];
    g.inputs.erase(g.inputs.begin() + 1);
    erase[lin[1]] = true;
    ++fused;
    log.debug("fuse_gate_up: {} reads {}", g.name, name);
  }
  if (fused == 0) return 0;
  remove_nodes(graph, erase);
  compact_values(graph);
  log.info("fuse_gate_up[{}]: stacked gate/up into one Linear for {} gated activations", graph.name,
           fused);
  return fused;
}

}  // namespace kiln
