// Input norms folded into the Linears that read them (CUDA plans). A LayerNorm's output
// (x - mean) * rstd * gamma + beta, multiplied by w, is
//   rstd * (x · (w * gamma)^T - mean * rowsum(w * gamma)) + w · beta,
// so the Linear takes x itself with the weight w * gamma, the bias bias + w · beta and the row
// sums as input 5, and the kernel applies mean and rstd after the product: a one-row decode
// step's GEMV sums the row while it streams the weights, off the critical path, and the norm's
// kernel is gone (BLOOM: both LayerNorms of every layer). RMSNorm (T5) folds the same way without
// the mean and the row sums. The one-row GEMV never rounds the normalized row; other steps
// standardize x with the norm kernel into the activations' type first, so a row's result can
// differ in the last bits between one row and more (the GEMV's row sums and cuBLASLt already
// made CUDA's Linears batch-dependent above a few rows).
// Folded only when every reader of the norm's output is a Linear reading it as its input, with
// a constant f32/f16/bf16 weight, and when the folded weight and bias stay finite in the
// weight's type; the norm then disappears from the graph. A weight that other nodes read too (a
// tied lm_head shares its table with the embedding: BLOOM's ln_f) is left as it is: gamma
// becomes the Linear's norm scale (operand kNormScale, multiplied into x on the fly), and
// the row sums are those of w * gamma. An int8 weight (CUDA int8-weight plans: q with per-row
// scales s) is folded the same way without touching q (a requantized w * gamma would round each
// weight twice): gamma becomes the norm scale, the row sums are q · gamma's (the scale multiplies
// the whole product after the norm, graph/linear.h) and the bias takes s * (q · beta); an int4
// weight likewise, its row sums and w · beta of q times each group's scale. Runs after
// narrow_graph (the types are final) and before plan_memory (the planner then keeps x alive
// until the last Linear has read it).
#include <algorithm>
#include <cmath>
#include <vector>

#include "core/f32_chunks.h"
#include "passes/pass.h"

namespace kiln {
namespace {

bool plain_float(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

// Whether Linear `d`'s weight is int8 with per-row f32 scales or int4 with f16 group scales,
// with a float input (int8-weight, int4-weight).
bool quantized_weight(const Graph& g, const LinearDesc& d) {
  if (!d.has(LinearOperand::kWeightScales) || d.has(LinearOperand::kInputScale)) return false;
  const Value& s = g.values[d.operand(LinearOperand::kWeightScales)];
  const DType w = g.values[d.operand(LinearOperand::kWeight)].dtype;
  if (s.kind != ValueKind::kWeight || !s.data.defined()) return false;
  return (w == DType::kI8 && s.dtype == DType::kF32 && s.data.rank() == 1) ||
         (w == DType::kI4 && s.dtype == DType::kF16 && s.data.rank() == 2);
}

// Whether node `i` reads `value` exactly once, as the input of a Linear whose weight can absorb
// a norm: constant, f32/f16/bf16 (read by other nodes too: `shared`) or int8 with per-row
// scales, plain.
bool foldable_reader(const Graph& g, int i, int value) {
  const Node& n = g.nodes[i];
  if (n.op != OpKind::kLinear) return false;
  const LinearDesc d = describe_linear(n);
  if (d.epilogue.norm || d.operand(LinearOperand::kX) != value) return false;
  for (int o = 1; o < kNumLinearOperands; ++o)
    if (d.operands[o] == value) return false;
  const bool quantized = quantized_weight(g, d);
  if (d.has(LinearOperand::kWeightScales) && !quantized) return false;
  const Value& w = g.values[d.operand(LinearOperand::kWeight)];
  return w.kind == ValueKind::kWeight && w.data.defined() && w.layout.plain() &&
         w.data.rank() == 2 && (quantized || plain_float(w.dtype));
}

bool constant_float(const Graph& g, int id) {
  return id >= 0 && g.values[id].kind == ValueKind::kWeight && g.values[id].data.defined() &&
         plain_float(g.values[id].dtype);
}

// One reader's folded operands: w * gamma in the weight's type (shared, and int8 weights: no new
// weight, gamma as the f32 norm scale); for LayerNorm the bias plus w · beta (in the bias's
// type; without a bias the weight's, an int8 weight's input's) and the f32 row sums of the
// folded weight (as stored; shared: of w * gamma; int8: of q * gamma, w · beta being
// s * (q · beta)). `finite`: every folded value is in the weight's (and the bias's) range.
struct Folded {
  Tensor weight, bias, row_sums, scale;
  bool finite = true;
};

// Streams the weight in chunks of rows (about 16 MiB of f32 each, core/f32_chunks.h), so that a
// build's memory is the folded copy, not an f32 one of the whole weight (a 7B model's tied
// lm_head is 4 GB in f32); each chunk's pages of a mapped weight are given back as it is done.
Folded fold(const Graph& g, const Node& lin, const std::vector<float>& gamma,
            const std::vector<float>& beta, bool layer, bool shared) {
  const LinearDesc d = describe_linear(lin);
  const Value& wv = g.values[d.operand(LinearOperand::kWeight)];
  const Tensor& w = wv.data;
  KILN_CHECK(w.is_contiguous(), "fuse_norm_linear: weight '{}' is not contiguous", wv.name);
  const int64_t out = w.dim(0), in = w.dim(1);
  // A quantized weight keeps q as it is. An int8 weight's row scales (its w · beta is
  // s * (q · beta)); an int4 weight's group scales (w = q · s[group], as the reference decodes it:
  // its row sums and w · beta are of those values).
  std::vector<float> row_scale, group_scale;
  const bool int4 = wv.dtype == DType::kI4;
  if (quantized_weight(g, d)) {
    shared = true;
    const Tensor s = g.values[d.operand(LinearOperand::kWeightScales)].data.to_f32();
    std::vector<float>& into = int4 ? group_scale : row_scale;
    into.assign(s.data<float>(), s.data<float>() + s.numel());
    const int64_t want = int4 ? out * int4_groups(in) : out;
    KILN_CHECK(static_cast<int64_t>(into.size()) == want,
               "fuse_norm_linear: weight '{}' [{}, {}] has {} scales, not {}", wv.name, out, in,
               into.size(), want);
  }
  const int64_t groups = int4_groups(in);
  const DTypeTraits& traits = dtype_traits(wv.dtype);
  const size_t row_bytes = dtype_bytes(wv.dtype, static_cast<size_t>(in));
  Folded f;
  if (shared) {
    // The weight stays: no scaled copy of it (a tied lm_head's is the whole embedding table).
    f.scale = Tensor::from_vector(gamma, {in});
  } else {
    f.weight = Tensor::empty(wv.dtype, {out, in});
  }
  std::vector<float> sums(layer ? static_cast<size_t>(out) : 0), bias;
  const int bias_id = d.operand(LinearOperand::kBias);
  const bool has_bias = bias_id >= 0;
  if (layer) {
    bias.assign(static_cast<size_t>(out), 0.0f);
    if (has_bias) {
      const Tensor b = g.values[bias_id].data.to_f32();
      std::copy(b.data<float>(), b.data<float>() + out, bias.begin());
    }
  }
  const int64_t chunk = std::max<int64_t>(1, (int64_t{4} << 20) / in);  // rows
  std::vector<float> sf(shared ? 0 : static_cast<size_t>(std::min(chunk, out) * in));
  for_each_f32_chunk(
      w, static_cast<size_t>(chunk * in), [&](const float* wf, size_t first, size_t n) {
        const int64_t o0 = static_cast<int64_t>(first) / in, rows = static_cast<int64_t>(n) / in;
        if (!shared) {
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t i = 0; i < in; ++i) sf[r * in + i] = wf[r * in + i] * gamma[i];
          char* dst = static_cast<char*>(f.weight.raw()) + static_cast<size_t>(o0) * row_bytes;
          traits.from_float(sf.data(), dst, n);
          traits.to_float(dst, sf.data(), n);  // as stored: the row sums are of these values
          f.finite = f.finite && std::all_of(sf.begin(), sf.begin() + static_cast<int64_t>(n),
                                             [](float v) { return std::isfinite(v); });
        }
        for (int64_t r = 0; layer && r < rows; ++r) {
          double sum = 0.0, b = bias[o0 + r];
          const float* gs = int4 ? group_scale.data() + (o0 + r) * groups : nullptr;
          for (int64_t i = 0; i < in; ++i) {
            const float wi = int4 ? wf[r * in + i] * gs[i / kInt4Group] : wf[r * in + i];
            sum += shared ? wi * gamma[i] : sf[r * in + i];
            b += static_cast<double>(wi) * beta[i];
          }
          if (!row_scale.empty()) b = bias[o0 + r] + (b - bias[o0 + r]) * row_scale[o0 + r];
          sums[o0 + r] = static_cast<float>(sum);
          bias[o0 + r] = static_cast<float>(b);
        }
        return true;
      });
  if (!layer) return f;
  const bool quantized = !row_scale.empty() || !group_scale.empty();
  const DType bias_type = has_bias    ? g.values[bias_id].dtype
                          : quantized ? g.values[d.operand(LinearOperand::kX)].dtype
                                      : wv.dtype;
  f.bias = Tensor::from_vector(bias, {out}).to(bias_type);
  const Tensor back = f.bias.to_f32();
  f.finite = f.finite && std::all_of(back.data<float>(), back.data<float>() + out,
                                     [](float v) { return std::isfinite(v); });
  f.row_sums = Tensor::from_vector(sums, {out});
  return f;
}

void apply(Graph& g, Node& lin, Folded f, const NormAttrs& norm, bool layer, int x) {
  const std::string wname = g.values[linear_operand(lin, LinearOperand::kWeight)].name;
  if (f.scale.defined()) {
    set_linear_operand(lin, LinearOperand::kNormScale,
                       g.add_weight(lin.name + ".norm_scale", std::move(f.scale)));
  } else {
    set_linear_operand(lin, LinearOperand::kWeight,
                       g.add_weight(wname + ".norm_folded", std::move(f.weight)));
  }
  if (layer) {
    set_linear_operand(lin, LinearOperand::kBias,
                       g.add_weight(lin.name + ".norm_folded_bias", std::move(f.bias)));
    set_linear_operand(lin, LinearOperand::kNormRowSums,
                       g.add_weight((f.scale.defined() ? lin.name : wname) + ".norm_row_sums",
                                    std::move(f.row_sums)));
  }
  set_linear_operand(lin, LinearOperand::kX, x);
  LinearEpilogue& e = lin.attr<LinearAttrs>().epilogue;
  e.norm = layer ? InputNorm::kLayerNorm : InputNorm::kRmsNorm;
  e.norm_eps = norm.eps;
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
    if (!std::all_of(rs.begin(), rs.end(), [&](int i) { return foldable_reader(graph, i, y); }))
      continue;
    const std::vector<float> gamma = floats_of(graph, norm.inputs[1]);
    const std::vector<float> beta = layer ? floats_of(graph, norm.inputs[2]) : std::vector<float>();
    std::vector<Folded> folded;
    for (int i : rs)
      folded.push_back(fold(graph, graph.nodes[i], gamma, beta, layer,
                            uses[linear_operand(graph.nodes[i], LinearOperand::kWeight)] > 1));
    if (!std::all_of(folded.begin(), folded.end(), [](const Folded& f) { return f.finite; })) {
      log.info("fuse_norm_linear: {} stays a node: its folded weights leave {}'s range", norm.name,
               dtype_name(
                   graph.values[linear_operand(graph.nodes[rs[0]], LinearOperand::kWeight)].dtype));
      continue;
    }
    const NormAttrs attrs = norm.attr<NormAttrs>();
    const int x = norm.inputs[0];
    const std::string norm_name = norm.name;
    for (size_t k = 0; k < rs.size(); ++k) {
      apply(graph, graph.nodes[rs[k]], std::move(folded[k]), attrs, layer, x);
      log.debug("fuse_norm_linear: {} into {}", norm_name, graph.nodes[rs[k]].name);
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
