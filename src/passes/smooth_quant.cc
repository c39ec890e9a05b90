#include "passes/smooth_quant.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "graph/linear.h"
#include "passes/calibration_cache.h"
#include "passes/precision_plan.h"

namespace kiln {
namespace {

constexpr float kFloor = 1e-5f;  // SmoothQuant's clamp of both maxima

// The normalized output of a norm node, and its gamma (and LayerNorm beta) inputs; -1 if none.
struct NormParts {
  int output = -1, gamma = -1, beta = -1;
};
NormParts norm_parts(const Node& n) {
  switch (n.op) {
    case OpKind::kRmsNorm:
      return {n.outputs[0], n.inputs[1], -1};
    case OpKind::kLayerNorm:
      return {n.outputs[0], n.inputs[1], n.inputs[2]};
    case OpKind::kAddRmsNorm:
      return {n.outputs[1], n.inputs[2], -1};
    case OpKind::kEmbedding:
    case OpKind::kLinear:
    case OpKind::kAdd:
    case OpKind::kMul:
    case OpKind::kScale:
    case OpKind::kActivation:
    case OpKind::kGatedActivation:
    case OpKind::kSoftmax:
    case OpKind::kCast:
    case OpKind::kAttention:
    case OpKind::kGatherRows:
      break;
  }
  return {};
}

// A float weight in its plain layout (f32; f16/bf16 where a cuda graph keeps the checkpoint's
// narrow weights before the precision pass).
bool plain_float_weight(const Value& v) {
  return v.kind == ValueKind::kWeight &&
         (v.dtype == DType::kF32 || v.dtype == DType::kF16 || v.dtype == DType::kBF16) &&
         v.data.defined() && v.layout.plain();
}

// A weight's values as a new f32 tensor of its own, to scale and store back with stored_as.
Tensor scalable_copy(const Tensor& w) { return w.dtype() == DType::kF32 ? w.clone() : w.to_f32(); }
Tensor stored_as(Tensor v, DType dtype) { return dtype == DType::kF32 ? v : v.to(dtype); }

// Weight column maxima: max over rows o of |w[o][j]|, folded into `col`.
void column_amax(const Tensor& w, std::vector<float>* col) {
  const Tensor c = w.dtype() != DType::kF32 ? w.to_f32() : w.is_contiguous() ? w : w.clone();
  const int64_t rows = c.dim(0), cols = c.dim(1);
  const float* p = c.data<float>();
  for (int64_t o = 0; o < rows; ++o)
    for (int64_t j = 0; j < cols; ++j) (*col)[j] = std::max((*col)[j], std::fabs(p[o * cols + j]));
}

}  // namespace

std::vector<SmoothTarget> smoothable_tensors(const Graph& g,
                                             const std::vector<std::string>& keep_float) {
  const std::set<std::string> keep(keep_float.begin(), keep_float.end());
  std::vector<int> uses(g.values.size(), 0);
  for (const Node& n : g.nodes)
    for (int in : n.inputs)
      if (in >= 0) ++uses[in];
  for (int out : g.outputs) ++uses[out];
  std::vector<std::vector<int>> readers(g.values.size());
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (int in : g.nodes[i].inputs)
      if (in >= 0) readers[in].push_back(static_cast<int>(i));
  const int logits = logits_linear(g);
  const std::set<int> outputs(g.outputs.begin(), g.outputs.end());
  std::vector<SmoothTarget> targets;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const NormParts parts = norm_parts(g.nodes[i]);
    if (parts.output < 0 || outputs.count(parts.output) != 0) continue;
    // The norm's parameters are its own f32 vectors.
    const bool own_params =
        plain_float_weight(g.values[parts.gamma]) && uses[parts.gamma] == 1 &&
        (parts.beta < 0 || (plain_float_weight(g.values[parts.beta]) && uses[parts.beta] == 1));
    if (!own_params || readers[parts.output].empty()) continue;
    bool ok = true;
    for (int r : readers[parts.output]) {
      const Node& n = g.nodes[r];
      if (n.op != OpKind::kLinear || r == logits || keep.count(n.name) != 0) {
        ok = false;
        break;
      }
      const LinearDesc d = describe_linear(n);
      int reads = 0;  // the tensor must be x, and only x
      for (int o : d.operands) reads += o == parts.output;
      const int w = d.operand(LinearOperand::kWeight);
      ok = reads == 1 && d.operand(LinearOperand::kX) == parts.output && !d.epilogue.norm &&
           plain_float_weight(g.values[w]) && g.values[w].data.rank() == 2 && uses[w] == 1;
      if (!ok) break;
    }
    if (!ok) continue;
    // A node that reads the tensor twice is listed twice: count distinct readers once.
    std::vector<int> linears = readers[parts.output];
    linears.erase(std::unique(linears.begin(), linears.end()), linears.end());
    targets.push_back({static_cast<int>(i), parts.output, std::move(linears)});
  }
  return targets;
}

std::map<std::string, std::vector<float>> smoothquant_factors(
    const ModelIR& model, const std::map<std::string, std::vector<float>>& channel_amax,
    double alpha, const std::vector<std::string>& keep_float) {
  KILN_CHECK_USAGE(alpha > 0.0 && alpha <= 1.0, "SmoothQuant alpha {} is not in (0, 1]", alpha);
  std::map<std::string, std::vector<float>> factors;
  for (const Graph& g : model.graphs)
    for (const SmoothTarget& t : smoothable_tensors(g, keep_float)) {
      const std::string name = calibrated_tensor_name(g, t.value);
      const auto it = channel_amax.find(name);
      KILN_CHECK(it != channel_amax.end(), "smoothquant: no channel statistics for {}", name);
      const std::vector<float>& x = it->second;
      std::vector<float> w(x.size(), 0.0f);
      for (int r : t.linears) {
        const Value& wv = g.values[linear_operand(g.nodes[r], LinearOperand::kWeight)];
        KILN_CHECK(wv.data.dim(1) == static_cast<int64_t>(x.size()),
                   "smoothquant: {} has {} channels, its reader {} takes {}", name, x.size(),
                   g.nodes[r].name, wv.data.dim(1));
        column_amax(wv.data, &w);
      }
      std::vector<float>& s = factors[name];
      s.resize(x.size());
      for (size_t j = 0; j < x.size(); ++j)
        s[j] = static_cast<float>(std::pow(std::max(x[j], kFloor), alpha) /
                                  std::pow(std::max(w[j], kFloor), 1.0 - alpha));
    }
  return factors;
}

int apply_smoothing(Graph& g, const std::map<std::string, std::vector<float>>& factors,
                    const std::vector<std::string>& keep_float, const Logger& log) {
  const std::string prefix = g.name + "/";
  std::map<std::string, const SmoothTarget*> by_name;
  const std::vector<SmoothTarget> targets = smoothable_tensors(g, keep_float);
  for (const SmoothTarget& t : targets) by_name[calibrated_tensor_name(g, t.value)] = &t;
  int smoothed = 0;
  for (const auto& [name, s] : factors) {
    if (name.rfind(prefix, 0) != 0) continue;
    const auto it = by_name.find(name);
    KILN_CHECK_USAGE(it != by_name.end(),
                     "smoothquant: {} is not a tensor this model can smooth (a norm's output "
                     "read by quantized Linears only); the calibration is another model's",
                     name);
    const SmoothTarget& t = *it->second;
    const NormParts parts = norm_parts(g.nodes[t.norm]);
    const int64_t width = g.values[parts.gamma].data.numel();
    KILN_CHECK_USAGE(static_cast<int64_t>(s.size()) == width,
                     "smoothquant: {} has {} channels, the calibration gives {} factors", name,
                     width, s.size());
    for (float f : s)
      KILN_CHECK_USAGE(std::isfinite(f) && f > 0.0f, "smoothquant: {} has a factor {}", name, f);
    // gamma / s (and beta / s): the norm's output divided channel by channel.
    for (int p : {parts.gamma, parts.beta}) {
      if (p < 0) continue;
      Tensor v = scalable_copy(g.values[p].data);
      float* d = v.data<float>();
      for (int64_t j = 0; j < width; ++j) d[j] /= s[j];
      g.set_weight_data(p, stored_as(std::move(v), g.values[p].dtype));
    }
    // Each reader's weight column j times s_j.
    for (int r : t.linears) {
      const int w = linear_operand(g.nodes[r], LinearOperand::kWeight);
      Tensor v = scalable_copy(g.values[w].data);
      const int64_t rows = v.dim(0);
      float* d = v.data<float>();
      for (int64_t o = 0; o < rows; ++o)
        for (int64_t j = 0; j < width; ++j) d[o * width + j] *= s[j];
      g.set_weight_data(w, stored_as(std::move(v), g.values[w].dtype));
    }
    ++smoothed;
  }
  if (smoothed > 0)
    log.info(
        "smoothing[{}]: {} norms' outputs divided channel by channel, their Linears' weight "
        "columns multiplied (SmoothQuant or AWQ factors)",
        g.name, smoothed);
  return smoothed;
}

}  // namespace kiln
