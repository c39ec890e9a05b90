// The precision pass's decisions (precision_plan.h). Two kinds of device, as core/target.h's
// table says:
// - f32 activations (the CPU): weight matrices are stored in the precision's type and read by
//   kernels that widen them; every other weight stays f32, with the reason.
// - narrow activations (CUDA fp16/bf16): every float value takes the plan's type except the nodes
//   kept wide. fp16 overflows T5's residual stream on real Flan-T5 checkpoints, so in an fp16
//   graph with RMSNorm (the T5 family) the stream stays f32 as HuggingFace keeps it: the norms,
//   the residual adds and row gathers that read the stream, and the FFN output projections
//   (HF's _keep_in_fp32_modules = ["wo"]), found by where they sit: the Linear that reads an
//   activation function's output.
// On both, a Linear the caller asks to keep in float (PrecisionOptions::keep_float), one the
// sensitivity fallback keeps (the calibration's CalibrationCache::fallback, with its measured
// error as the reason), or one whose matrix the type cannot hold, stays f32.
// int8 (W8A8, the CPU): every Linear with an i8 weight also reads its input as int8, with the
// calibrated per-tensor scale of that input (PrecisionOptions::calibration), except the logits
// Linear, which keeps an f32 input (int8 weights as int8-weight plans): the final choice of each
// token reads its output. Norms, softmax, attention and the residual adds compute in f32 as in
// every CPU plan; Embedding tables are int8 with per-row scales (a gather: nothing to quantize).
// fp8 (CUDA, sm_89+): as int8 (W8A8) with E4M3 for int8: Linear weights E4M3 with per-channel
// scales, each reading its input as E4M3 with the calibrated scale (the cache's int8 threshold
// over 448); the logits Linear, Embedding tables, matrices whose input dimension is not a
// multiple of 16 and (fp16 T5) the FFN output projections reading f32 keep int8 weights.
// int4-weight (the CPU, and CUDA with fp16 activations): Linear weights are int4 with f16 group
// scales, except the matrices it keeps as int8-weight stores them (int8 per row), each with its
// reason: the logits Linear's (every token is chosen from its output), Embedding tables (a
// gather; BLOOM's tied lm_head is one) and matrices int4 cannot hold (an odd input dimension, a
// scale beyond fp16; on CUDA an input dimension that is not a multiple of 16).
#include "passes/precision_plan.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <vector>

#include "core/f32_chunks.h"
#include "passes/quantize_weights.h"

namespace kiln {
namespace {

struct Use {
  int node;
  size_t slot;
};

// The inputs that hold a weight matrix the precision applies to: a Linear's weight [out, in]
// and an Embedding's table [vocab, d].
bool is_matrix_slot(const Node& n, size_t slot) {
  return (n.op == OpKind::kLinear && slot == 1) || (n.op == OpKind::kEmbedding && slot == 0);
}

// Why a weight that is not a matrix stays f32 (f32-activation devices), by a node reading it.
std::string small_weight_reason(const Node& n, size_t slot) {
  switch (n.op) {
    case OpKind::kRmsNorm:
    case OpKind::kLayerNorm:
    case OpKind::kAddRmsNorm:
      return "norm parameters: normalization is computed in fp32 and these are one vector per "
             "norm (negligible bytes)";
    case OpKind::kLinear:
      return slot == 2 ? "Linear bias: added to the fp32 accumulator, one value per output "
                         "(negligible bytes)"
                       : "per-channel scales of an int8 weight are fp32 by definition";
    case OpKind::kAttention:
      return "position-bias table: added to fp32 attention scores (negligible bytes)";
    case OpKind::kEmbedding:
      return "per-row scales of an int8 table are fp32 by definition";
    case OpKind::kAdd:
    case OpKind::kMul:
    case OpKind::kScale:
    case OpKind::kActivation:
    case OpKind::kGatedActivation:
    case OpKind::kSoftmax:
    case OpKind::kCast:
    case OpKind::kGatherRows:
      break;
  }
  return fmt::format("read by {} '{}', which computes in fp32", op_name(n.op), n.name);
}

// A Linear reading an activation function's output: the FFN's output projection (T5's `wo`),
// whether the activation is a node of its own, gated, or fused into the Linear before it.
bool is_ffn_output(const Graph& g, const Node& n) {
  if (n.op != OpKind::kLinear || !n.has_input(0)) return false;
  const int producer = g.values[n.inputs[0]].producer;
  if (producer < 0) return false;
  const Node& p = g.nodes[producer];
  return p.op == OpKind::kActivation || p.op == OpKind::kGatedActivation ||
         (p.op == OpKind::kLinear && p.attr<LinearAttrs>().epilogue.activation.has_value());
}

constexpr std::string_view kStreamWhy =
    "T5's residual stream: fp16 overflows it on real checkpoints, so it stays f32 as HuggingFace "
    "keeps it";
constexpr std::string_view kFfnOutputWhy =
    "T5's FFN output projection (it reads the activation and writes the f32 residual stream): "
    "f32 as HuggingFace's _keep_in_fp32_modules keeps it";
constexpr std::string_view kRequestedWhy = "kept in float as the build asked";
constexpr std::string_view kLogitsWhy =
    "the logits Linear: int8 weights with an f32 input (as int8-weight plans) — every token is "
    "chosen from its output, and one static scale for the final norm's output would clip or "
    "coarsen what decides it";

constexpr std::string_view kInt4LogitsWhy =
    "int8 as int8-weight plans store it: the logits Linear chooses every token, and int4's "
    "16 levels a group move the top logits the most";
constexpr std::string_view kFp8LogitsWhy =
    "int8 with an fp16 input, as int8-weight plans store it: the logits Linear chooses every "
    "token, and one static E4M3 scale for the final norm's output would coarsen what decides it";
constexpr std::string_view kInt4TableWhy =
    "int8 as int8-weight plans store it: an Embedding table (a gather of one row a token, no "
    "int4 kernel)";
constexpr std::string_view kFp8TableWhy =
    "int8 as int8-weight plans store it: an Embedding table (a gather of one row a token, no "
    "fp8 kernel)";

// int4-weight and fp8: why a matrix that the precision's type would take stays int8 (empty: it
// becomes `matrix`). `cuda`: the CUDA int4 kernels load 16 weights at a time and cuBLASLt's FP8
// GEMMs take rows of a multiple of 16, so the input dimension is a multiple of 16.
std::string kept_int8(const Graph& g, const Value& v, const std::vector<Use>& uses, bool cuda,
                      DType matrix) {
  const bool fp8 = matrix == DType::kF8E4M3;
  const int logits = logits_linear(g);
  for (const Use& u : uses) {
    if (g.nodes[u.node].op == OpKind::kEmbedding)
      return std::string(fp8 ? kFp8TableWhy : kInt4TableWhy);
    if (u.node == logits) return std::string(fp8 ? kFp8LogitsWhy : kInt4LogitsWhy);
  }
  if (!fp8)
    if (std::string why = int4_refused(v.data); !why.empty())
      return "int8 as int8-weight plans store it: " + why;
  if (cuda && v.data.dim(1) % 16 != 0)
    return fmt::format(
        "int8 as int8-weight plans store it: its input dimension {} is not a multiple of 16 (the "
        "cuda {} kernels take 16 weights at a time)",
        v.data.dim(1), fp8 ? "fp8" : "int4");
  return {};
}

// The sensitivity fallback's measurement of node `name`, when the calibration keeps it in f32.
const LayerSensitivity* fallback_of(const PrecisionOptions& options, const std::string& name) {
  if (!options.calibration) return nullptr;
  const auto it = options.calibration->fallback.find(name);
  return it == options.calibration->fallback.end() ? nullptr : &it->second;
}

// fp16 T5: the nodes of the f32 residual stream, with why.
void mark_residual_stream(const Graph& g, PrecisionPlan* plan) {
  std::vector<bool> wide_value(g.values.size(), false);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    std::string_view why;
    if (n.op == OpKind::kRmsNorm || n.op == OpKind::kAddRmsNorm) why = kStreamWhy;
    if (is_ffn_output(g, n)) why = kFfnOutputWhy;
    // Adds and row gathers of the stream stay in it (a gather of the last rows before the
    // final norm must not round the stream to fp16).
    if (n.op == OpKind::kAdd || n.op == OpKind::kGatherRows)
      for (int in : n.inputs)
        if (in >= 0 && wide_value[in]) why = kStreamWhy;
    if (why.empty()) continue;
    plan->wide[i] = true;
    plan->node_why[i] = std::string(why);
    for (int out : n.outputs) wide_value[out] = true;
  }
}

// W8A8: which Linears read their input as int8 (a calibrated scale from the cache) and why the
// others keep an f32 input. After the weights are decided: only an i8 weight makes an int8 product.
void plan_input_scales(const Graph& g, const PrecisionOptions& options, PrecisionPlan* plan) {
  KILN_CHECK(options.calibration.has_value(),
             "graph '{}': {} plans quantize Linear inputs with calibrated scales, and the build "
             "has no calibration",
             g.name, precision_name(plan->support->precision));
  const CalibrationCache& cache = *options.calibration;
  const int logits = logits_linear(g);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.op != OpKind::kLinear || plan->wide[i]) continue;
    const int x = linear_operand(n, LinearOperand::kX);
    const int w = linear_operand(n, LinearOperand::kWeight);
    if (static_cast<int>(i) == logits) {
      plan->input_why[i] = std::string(kLogitsWhy);
      continue;
    }
    const bool fp8 = plan->weight[w] == DType::kF8E4M3;
    if (plan->weight[w] != DType::kI8 && !fp8) {
      plan->input_why[i] = fmt::format(
          "input kept f32: its weight stays {} ({})", dtype_name(plan->weight[w]),
          plan->weight_why[w].empty() ? "not an f32 weight matrix" : plan->weight_why[w]);
      continue;
    }
    const std::string name = calibrated_tensor_name(g, x);
    const auto it = cache.scales.find(name);
    KILN_CHECK_USAGE(it != cache.scales.end(),
                     "calibration {} has no scale for {} (the input of {})",
                     options.calibration_source, name, n.name);
    // The cache holds int8 scales (threshold / 127); an E4M3 input's is threshold / 448.
    plan->input_scale[i] = fp8 ? fp8_scale_from_int8(it->second) : it->second;
  }
}

}  // namespace

int logits_linear(const Graph& g) {
  for (int out : g.outputs) {
    if (g.values[out].name != "logits") continue;
    int producer = g.values[out].producer;
    while (producer >= 0 && g.nodes[producer].op == OpKind::kCast)
      producer = g.values[g.nodes[producer].inputs[0]].producer;
    if (producer >= 0 && g.nodes[producer].op == OpKind::kLinear) return producer;
  }
  return -1;
}

std::string narrowing_refused(const Tensor& w, DType to) {
  if (w.dtype() == to) return {};
  // A chunk at a time (core/f32_chunks.h): the scan of a 7B model's weights is not 7B weights of
  // resident memory.
  float amax = 0.0f;
  const bool finite =
      for_each_f32_chunk(w, size_t{1} << 20, [&](const float* values, size_t, size_t n) {
        for (size_t j = 0; j < n; ++j) {
          if (!std::isfinite(values[j])) return false;
          amax = std::max(amax, std::fabs(values[j]));
        }
        return true;
      });
  if (!finite) return "holds a non-finite value";
  if (to == DType::kF16 && amax > 65504.0f)
    return fmt::format("max |w| = {:g} exceeds fp16's largest finite value 65504", amax);
  return {};
}

PrecisionPlan plan_precision(const Graph& g, const PrecisionSupport& support,
                             const PrecisionOptions& options) {
  PrecisionPlan plan;
  plan.support = &support;
  plan.wide.assign(g.nodes.size(), false);
  plan.node_why.assign(g.nodes.size(), {});
  plan.weight.resize(g.values.size());
  plan.weight_why.assign(g.values.size(), {});
  plan.input_scale.assign(g.nodes.size(), -1.0f);
  plan.input_why.assign(g.nodes.size(), {});
  for (size_t id = 0; id < g.values.size(); ++id) plan.weight[id] = g.values[id].dtype;
  const bool narrow_activations = support.activation != DType::kF32;
  std::vector<std::vector<Use>> uses(g.values.size());
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (size_t s = 0; s < g.nodes[i].inputs.size(); ++s)
      if (g.nodes[i].inputs[s] >= 0) uses[g.nodes[i].inputs[s]].push_back({static_cast<int>(i), s});

  // Nodes computing in f32: the fp16 T5 residual stream, the Linears asked for, and (on
  // narrow-activation devices, where the weight's type is the node's) matrices the type cannot
  // hold.
  if (narrow_activations) {
    const bool has_rms = std::any_of(g.nodes.begin(), g.nodes.end(), [](const Node& n) {
      return n.op == OpKind::kRmsNorm || n.op == OpKind::kAddRmsNorm;
    });
    if (support.activation == DType::kF16 && has_rms) mark_residual_stream(g, &plan);
  }
  // Nodes wide for their activations' range alone (fp16 T5's residual stream): a weight-only
  // quantized plan still quantizes their matrices (f32 activations, int8 weights).
  std::vector<bool> range_only = plan.wide;
  const std::set<std::string> keep(options.keep_float.begin(), options.keep_float.end());
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    if (n.op != OpKind::kLinear && n.op != OpKind::kEmbedding) continue;
    if (keep.count(n.name) != 0) {
      plan.wide[i] = true;
      range_only[i] = false;
      plan.node_why[i] = std::string(kRequestedWhy);
    } else if (const LayerSensitivity* fb = fallback_of(options, n.name)) {
      plan.wide[i] = true;
      range_only[i] = false;
      plan.node_why[i] = fallback_reason(*fb, options.calibration->quant_tolerance);
    } else if (narrow_activations && !plan.wide[i]) {
      const int w = n.inputs[n.op == OpKind::kLinear ? 1 : 0];
      if (g.values[w].kind == ValueKind::kWeight)
        if (std::string why = narrowing_refused(g.values[w].data, support.activation);
            !why.empty()) {
          plan.warnings.push_back(
              fmt::format("{} '{}' computes in f32: its weight {}", op_name(n.op), n.name, why));
          plan.wide[i] = true;
          plan.node_why[i] = "its weight " + why;
        }
    }
  }

  // Weight `id` stored as the precision's matrix type; int4-weight and fp8 keep some matrices
  // int8.
  // `f32_reader`: a reader kept f32 for its activations' range (fp16 T5's FFN output
  // projections), which an fp8 plan gives int8 weights (its E4M3 Linears read quantized inputs).
  auto store_matrix = [&](size_t id, bool f32_reader) {
    plan.weight[id] = support.matrix;
    if (support.matrix == DType::kF8E4M3 && f32_reader) {
      plan.weight[id] = DType::kI8;
      plan.weight_why[id] =
          "int8 as int8-weight plans store it: its Linear reads f32 activations (fp16 T5's "
          "residual stream), which fp8 plans do not quantize";
      return;
    }
    if (support.matrix == DType::kI4 || support.matrix == DType::kF8E4M3)
      if (std::string why =
              kept_int8(g, g.values[id], uses[id], narrow_activations, support.matrix);
          !why.empty()) {
        plan.weight[id] = DType::kI8;
        plan.weight_why[id] = std::move(why);
      }
  };

  // Weights.
  for (size_t id = 0; id < g.values.size(); ++id) {
    const Value& v = g.values[id];
    if (v.kind != ValueKind::kWeight || uses[id].empty() || !dtype_traits(v.dtype).is_float)
      continue;
    if (narrow_activations) {
      // A wide Linear reads its weights (and bias) in f32, a wide Embedding its table; every
      // other float weight, norm parameters included, takes the plan's type.
      // Weight-only quantized plans (int8-weight on CUDA): matrices read only as matrices are
      // stored quantized, the rest (norms, biases, position tables) in the activations' type;
      // a matrix whose wide readers are wide for their activations' range alone too.
      const bool matrix_only = std::all_of(uses[id].begin(), uses[id].end(), [&](const Use& u) {
        return is_matrix_slot(g.nodes[u.node], u.slot) &&
               (!plan.wide[u.node] || range_only[u.node]);
      });
      const bool quantize = support.matrix != support.activation && matrix_only;
      const auto wide_reader = std::find_if(uses[id].begin(), uses[id].end(), [&](const Use& u) {
        const Node& n = g.nodes[u.node];
        return plan.wide[u.node] && ((n.op == OpKind::kLinear && u.slot >= 1) ||
                                     (n.op == OpKind::kEmbedding && u.slot == 0));
      });
      if (wide_reader != uses[id].end() && !quantize) {
        plan.weight[id] = DType::kF32;
        plan.weight_why[id] = plan.node_why[wide_reader->node];
        continue;
      }
      plan.weight[id] = support.activation;
      if (!quantize) continue;
      if (std::string why = narrowing_refused(v.data, support.matrix); !why.empty()) {
        // Not quantized: in the type of its readers (f32 where a wide one reads it).
        const DType kept = wide_reader != uses[id].end() ? DType::kF32 : support.activation;
        plan.weight[id] = kept;
        plan.warnings.push_back(fmt::format("{} stays {}: {}", v.name, dtype_name(kept), why));
        plan.weight_why[id] = std::move(why);
        continue;
      }
      store_matrix(id, wide_reader != uses[id].end());
      continue;
    }
    if (v.dtype != DType::kF32) {
      plan.weight_why[id] =
          fmt::format("already {} in the graph (not an f32 weight)", dtype_name(v.dtype));
      continue;
    }
    const auto other = std::find_if(uses[id].begin(), uses[id].end(), [&](const Use& u) {
      return !is_matrix_slot(g.nodes[u.node], u.slot);
    });
    if (other != uses[id].end()) {
      // A matrix also read as something else (never in the HF graphs) stays f32 for that reader.
      plan.weight_why[id] = small_weight_reason(g.nodes[other->node], other->slot);
      continue;
    }
    const auto kept = std::find_if(uses[id].begin(), uses[id].end(),
                                   [&](const Use& u) { return plan.wide[u.node]; });
    if (kept != uses[id].end()) {
      plan.weight_why[id] = plan.node_why[kept->node];
      continue;
    }
    if (std::string why = narrowing_refused(v.data, support.matrix); !why.empty()) {
      plan.warnings.push_back(fmt::format("{} stays f32: {}", v.name, why));
      plan.weight_why[id] = std::move(why);
      continue;
    }
    store_matrix(id, false);
  }
  if (support.calibrated_inputs) plan_input_scales(g, options, &plan);
  return plan;
}

}  // namespace kiln
