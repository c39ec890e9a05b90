// Input norms folded into the Linears that read them (CUDA plans). A LayerNorm's output
// (x - mean) * rstd * gamma + beta, multiplied by w, is
//   rstd * (x · (w * gamma)^T - mean * rowsum(w * gamma)) + w · beta,
// so the Linear takes x itself with the weight w * gamma, the bias bias + w · beta and the row
// sums as input 5, and the kernel applies mean and rstd after the product: a decode step's GEMV
// computes a row's sums while it streams the weights, off the critical path, and the norm's
// kernel is gone (BLOOM: both LayerNorms of every layer). RMSNorm (T5) folds the same way without
// the mean and the row sums. The normalized activation is no longer rounded to the activations'
// type before the product (more precise than the unfused graph, not bit-identical to it).
// Folded only when every reader of the norm's output is a Linear reading it as its input, of the
// same type, with a constant float weight that no other node reads (a tied lm_head shares its
// table with the embedding and is left alone); the norm then disappears from the graph. Runs
// after narrow_graph (the types are final) and before plan_memory (the planner then keeps x
// alive until the last Linear has read it).
#include <algorithm>
#include <vector>

#include "passes/pass.h"

namespace kiln {
namespace {

// Whether node `i` reads `value` exactly once, as the input of a Linear whose weight can absorb
// a norm: constant, float, plain, read by this node only.
bool foldable_reader(const Graph& g, int i, int value, const std::vector<int>& uses) {
  const Node& n = g.nodes[i];
  if (n.op != OpKind::kLinear || n.attr<LinearAttrs>().norm || n.inputs.size() < 2 ||
      n.inputs[0] != value)
    return false;
  for (size_t k = 1; k < n.inputs.size(); ++k)
    if (n.inputs[k] == value) return false;
  if (n.inputs.size() > 3 && n.inputs[3] >= 0) return false;  // per-channel scales
  const Value& w = g.values[n.inputs[1]];
  if (w.kind != ValueKind::kWeight || !w.data.defined() || !w.layout.plain() ||
      w.data.rank() != 2 || uses[n.inputs[1]] != 1 || !dtype_traits(w.dtype).is_float)
    return false;
  return g.values[n.outputs[0]].dtype == g.values[value].dtype;
}

bool constant_float(const Graph& g, int id) {
  return id >= 0 && g.values[id].kind == ValueKind::kWeight && g.values[id].data.defined() &&
         dtype_traits(g.values[id].dtype).is_float;
}

int add_weight(Graph& g, std::string name, Tensor data) {
  Value v;
  v.name = std::move(name);
  v.dtype = data.dtype();
  for (int64_t d : data.shape()) v.shape.push_back(Dim::of(d));
  v.kind = ValueKind::kWeight;
  v.data = std::move(data);
  g.values.push_back(std::move(v));
  return static_cast<int>(g.values.size()) - 1;
}

// Folds norm (gamma, beta: f32 [in]; beta empty for RMSNorm) into Linear `lin`.
void fold(Graph& g, Node& lin, const std::vector<float>& gamma, const std::vector<float>& beta,
          const NormAttrs& norm, bool layer, int x) {
  const Value& wv = g.values[lin.inputs[1]];
  const Tensor w = wv.data.to_f32();
  const int64_t out = w.dim(0), in = w.dim(1);
  const float* wf = w.data<float>();
  Tensor scaled = Tensor::empty(DType::kF32, {out, in});
  float* sf = scaled.data<float>();
  for (int64_t o = 0; o < out; ++o)
    for (int64_t i = 0; i < in; ++i) sf[o * in + i] = wf[o * in + i] * gamma[i];
  const Tensor stored = scaled.to(wv.dtype);
  const std::string wname = wv.name;
  const DType dtype = wv.dtype;
  const int w_id = add_weight(g, wname + ".norm_folded", stored);
  lin.inputs[1] = w_id;
  if (layer) {
    // The row sums of the weight as stored, and the bias plus w · beta (in the bias's type).
    const Tensor back = stored.to_f32();
    std::vector<float> sums(static_cast<size_t>(out));
    for (int64_t o = 0; o < out; ++o) {
      double s = 0.0;
      for (int64_t i = 0; i < in; ++i) s += back.data<float>()[o * in + i];
      sums[o] = static_cast<float>(s);
    }
    const bool has_bias = lin.inputs.size() > 2 && lin.inputs[2] >= 0;
    const DType bias_type = has_bias ? g.values[lin.inputs[2]].dtype : dtype;
    std::vector<float> bias(static_cast<size_t>(out), 0.0f);
    if (has_bias) {
      const Tensor b = g.values[lin.inputs[2]].data.to_f32();
      std::copy(b.data<float>(), b.data<float>() + out, bias.begin());
    }
    for (int64_t o = 0; o < out; ++o) {
      double s = bias[o];
      for (int64_t i = 0; i < in; ++i) s += static_cast<double>(wf[o * in + i]) * beta[i];
      bias[o] = static_cast<float>(s);
    }
    if (lin.inputs.size() <= kLinearNormRowSums) lin.inputs.resize(kLinearNormRowSums + 1, -1);
    lin.inputs[2] = add_weight(g, lin.name + ".norm_folded_bias",
                               Tensor::from_vector(bias, {out}).to(bias_type));
    lin.inputs[kLinearNormRowSums] =
        add_weight(g, wname + ".norm_row_sums", Tensor::from_vector(sums, {out}));
  }
  lin.inputs[0] = x;
  LinearAttrs& a = lin.attr<LinearAttrs>();
  a.norm = layer ? InputNorm::kLayerNorm : InputNorm::kRmsNorm;
  a.norm_eps = norm.eps;
}

std::vector<float> floats_of(const Graph& g, int id) {
  const Tensor t = g.values[id].data.to_f32();
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

}  // namespace

int fuse_norm_linear(Graph& graph, const Logger& log) {
  const std::vector<int> uses = use_counts(graph);
  std::vector<std::vector<int>> readers(graph.values.size());
  for (size_t i = 0; i < graph.nodes.size(); ++i)
    for (int id : graph.nodes[i].inputs)
      if (id >= 0) readers[id].push_back(static_cast<int>(i));
  std::vector<bool> erase(graph.nodes.size(), false);
  int fused = 0, linears = 0;
  for (size_t j = 0; j < graph.nodes.size(); ++j) {
    const Node& norm = graph.nodes[j];
    const bool layer = norm.op == OpKind::kLayerNorm;
    if ((!layer && norm.op != OpKind::kRmsNorm) || norm.outputs.size() != 1) continue;
    if (!constant_float(graph, norm.inputs[1]) || (layer && !constant_float(graph, norm.inputs[2])))
      continue;
    const int y = norm.outputs[0];
    const std::vector<int> rs = readers[y];
    // Every use is one of the readers' inputs (a graph output is a use no node accounts for).
    if (rs.empty() || uses[y] != static_cast<int>(rs.size())) continue;
    if (!std::all_of(rs.begin(), rs.end(),
                     [&](int i) { return foldable_reader(graph, i, y, uses); }))
      continue;
    const std::vector<float> gamma = floats_of(graph, norm.inputs[1]);
    const std::vector<float> beta = layer ? floats_of(graph, norm.inputs[2]) : std::vector<float>();
    const NormAttrs attrs = norm.attr<NormAttrs>();
    const int x = norm.inputs[0];
    const std::string norm_name = norm.name;
    for (int i : rs) {
      fold(graph, graph.nodes[i], gamma, beta, attrs, layer, x);
      log.debug("fuse_norm_linear: {} into {}", norm_name, graph.nodes[i].name);
      ++linears;
    }
    graph.values[y].producer = -1;
    erase[j] = true;
    ++fused;
  }
  if (fused == 0) return 0;
  remove_nodes(graph, erase);
  compact_values(graph);
  log.info("fuse_norm_linear[{}]: folded {} norms into the {} linears that read them", graph.name,
           fused, linears);
  return fused;
}

}  // namespace kiln
