// The precision pass: one entry point for every device (pass.h: assign_precision). The decisions
// come from precision_plan.cc; this file carries them out on f32-activation devices (the CPU):
// weight matrices stored in the plan's type (bf16, f16, int8 with per-output-channel f32
// scales, or int4 with f16 group scales and int8 where the plan keeps it: quantize_weights.h),
// every other weight f32 with the reason recorded for `kiln inspect`. Activations,
// norms, softmax, accumulation and the KV cache stay f32: only weight storage (the bytes a decode
// step streams) gets narrower — except in int8 (W8A8) plans, whose quantized Linears read their
// f32 input as int8 with a calibrated scale (an input-scale operand each). Narrow-activation
// devices (CUDA) go to narrow_graph.cc.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "core/half.h"
#include "passes/pass.h"
#include "passes/precision_plan.h"
#include "passes/quantize_weights.h"

namespace kiln {
namespace {

// How one weight is read: the node and which of its inputs.
struct Use {
  int node;
  size_t slot;
};

// Stores each weight as the plan says: f32 weights become the plan's matrix type (int8 with
// per-row scales, int4 with group scales, or narrow with a Cast after each Embedding of a narrow
// table); an int4-weight plan stores the matrices it keeps at int8 as int8-weight does. The
// scales are a weight of their own, input 3 of a Linear and input 2 of an Embedding. Returns
// the matrices converted.
int store_weights(Graph& graph, const PrecisionPlan& plan, const Logger& log) {
  std::vector<std::vector<Use>> uses(graph.values.size());
  for (size_t i = 0; i < graph.nodes.size(); ++i)
    for (size_t s = 0; s < graph.nodes[i].inputs.size(); ++s)
      if (graph.nodes[i].inputs[s] >= 0)
        uses[graph.nodes[i].inputs[s]].push_back({static_cast<int>(i), s});
  std::map<DType, int> converted;
  int64_t bytes_before = 0, bytes_after = 0;
  const size_t num_values = graph.values.size();  // scales are appended below
  for (size_t id = 0; id < num_values; ++id) {
    if (graph.values[id].kind != ValueKind::kWeight || uses[id].empty() ||
        graph.values[id].dtype != DType::kF32 || plan.weight[id] == DType::kF32)
      continue;
    const DType to = plan.weight[id];
    bytes_before += static_cast<int64_t>(graph.values[id].data.nbytes());
    if (to == DType::kI8 || to == DType::kI4) {
      bytes_after += quantize_weight(graph, static_cast<int>(id), to);
      ++converted[to];
      continue;
    }
    graph.set_weight_data(static_cast<int>(id), graph.values[id].data.to(to));
    Value& v = graph.values[id];
    v.dtype = to;
    // An Embedding of a narrow table gathers narrow rows; widen them for the f32 graph.
    for (const Use& u : uses[id]) {
      Node& n = graph.nodes[u.node];
      if (n.op != OpKind::kEmbedding) continue;
      const int out = n.outputs[0];
      Value narrow;
      narrow.name = graph.values[out].name + "." + std::string(dtype_name(to));
      narrow.dtype = to;
      narrow.shape = graph.values[out].shape;
      narrow.producer = u.node;
      graph.values.push_back(std::move(narrow));
      const int narrow_id = static_cast<int>(graph.values.size()) - 1;
      graph.nodes[u.node].outputs[0] = narrow_id;
      Node cast;
      cast.op = OpKind::kCast;
      cast.name = graph.nodes[u.node].name + ".widen";
      cast.inputs = {narrow_id};
      cast.outputs = {out};
      cast.attrs = CastAttrs{DType::kF32};
      graph.nodes.insert(graph.nodes.begin() + u.node + 1, std::move(cast));
      // Inserting shifts the indices of later nodes: renumber producers and pending uses.
      for (Value& val : graph.values)
        if (val.producer > u.node) ++val.producer;
      graph.values[out].producer = u.node + 1;
      for (auto& list : uses)
        for (Use& later : list)
          if (later.node > u.node) ++later.node;
    }
    bytes_after += static_cast<int64_t>(graph.values[id].data.nbytes());
    ++converted[to];
  }
  int total = 0;
  std::string stored;
  for (const auto& [type, count] : converted) {
    total += count;
    stored += fmt::format("{}{} as {}{}", stored.empty() ? "" : ", ", count, dtype_name(type),
                          type == DType::kI8   ? " with per-row f32 scales"
                          : type == DType::kI4 ? " with f16 scales per group of 128"
                                               : "");
  }
  if (total > 0)
    log.info(
        "assign_precision[{}]: {} weight matrices stored ({}; {:.1f} MiB → {:.1f} MiB); norms, "
        "biases and position tables stay f32",
        graph.name, total, stored, static_cast<double>(bytes_before) / (1 << 20),
        static_cast<double>(bytes_after) / (1 << 20));
  return total;
}

}  // namespace

int64_t quantize_weight(Graph& graph, int id, DType to) {
  KILN_CHECK(to == DType::kI8 || to == DType::kI4 || to == DType::kF8E4M3,
             "quantize_weight: {} is no quantized type", dtype_name(to));
  Value& value = graph.values[static_cast<size_t>(id)];
  KILN_CHECK(value.kind == ValueKind::kWeight && dtype_traits(value.dtype).is_float,
             "quantize_weight: '{}' is not a float weight", value.name);
  // A narrow checkpoint's weight (kept narrow on CUDA: keep_narrow_weights) is widened first.
  const Tensor wide = value.dtype == DType::kF32 ? value.data : value.data.to(DType::kF32);
  Tensor q, scales;
  if (to == DType::kI8)
    quantize_rows_int8(wide, &q, &scales);
  else if (to == DType::kF8E4M3)
    quantize_rows_fp8(wide, &q, &scales);
  else
    quantize_groups_int4(wide, &q, &scales);
  const int64_t bytes = static_cast<int64_t>(q.nbytes() + scales.nbytes());
  const std::string name = value.name + ".scales";
  graph.set_weight_data(id, std::move(q));
  graph.values[static_cast<size_t>(id)].dtype = to;
  const int scales_id = graph.add_weight(name, std::move(scales));
  for (Node& n : graph.nodes)
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      if (n.inputs[k] != id) continue;
      const size_t scale_slot = n.op == OpKind::kLinear ? slot(LinearOperand::kWeightScales) : 2;
      if (n.inputs.size() <= scale_slot) n.inputs.resize(scale_slot + 1, -1);
      n.inputs[scale_slot] = scales_id;
      break;
    }
  return bytes;
}

namespace {

// W8A8: each Linear the plan quantizes reads its calibrated input scale, a weight [1] of its own
// (LinearOperand::kInputScale). By node name: storing the weights may insert Casts. Returns
// the Linears given one.
// `scale_of`: the plan's scales by node name, taken before the weights were stored.
int attach_input_scales(Graph& graph, const std::map<std::string, float>& scale_of, int kept,
                        const std::string& source, const Logger& log) {
  int quantized = 0, fp8 = 0;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    const auto it = scale_of.find(graph.nodes[i].name);
    if (graph.nodes[i].op != OpKind::kLinear || it == scale_of.end()) continue;
    const int id = graph.add_weight(graph.nodes[i].name + ".input_scale",
                                    Tensor::from_vector<float>({it->second}, {1}));
    set_linear_operand(graph.nodes[i], LinearOperand::kInputScale, id);
    ++quantized;
    fp8 += graph.values[linear_operand(graph.nodes[i], LinearOperand::kWeight)].dtype ==
           DType::kF8E4M3;
  }
  if (quantized > 0 || kept > 0)
    log.info(
        "assign_precision[{}]: {} Linears read {} inputs ({}static scales from {}); {} keep "
        "float inputs (kiln inspect --layers says why)",
        graph.name, quantized,
        fp8 == quantized && fp8 > 0 ? "E4M3"
        : fp8 > 0                   ? "int8 or E4M3"
                                    : "int8",
        fp8 > 0 ? "" : "W8A8, ", source, kept);
  return quantized;
}

}  // namespace

int assign_precision(Graph& graph, const PrecisionSupport& support, const PrecisionOptions& options,
                     std::vector<PrecisionNote>* notes, const Logger& log) {
  KILN_CHECK_USAGE(support.supported, "graph '{}': {} plans on the {}: {}", graph.name,
                   precision_name(support.precision), device_name(support.device),
                   support.unsupported);
  if (support.matrix == DType::kF32 && support.activation == DType::kF32) return 0;
  const PrecisionPlan plan = plan_precision(graph, support, options);
  for (const std::string& w : plan.warnings) log.warn("assign_precision[{}]: {}", graph.name, w);
  // The notes, in the graph's names as the plan has them before anything is renamed.
  auto note = [&](std::string node, std::string weight, const std::string& reason) {
    log.debug("assign_precision[{}]: {}{} stays wider: {}", graph.name, node, weight, reason);
    if (notes) notes->push_back({graph.name, std::move(weight), reason, std::move(node)});
  };
  int wide = 0;
  for (size_t i = 0; i < graph.nodes.size(); ++i)
    if (!plan.node_why[i].empty()) {
      note(graph.nodes[i].name, {}, plan.node_why[i]);
      ++wide;
    }
  for (size_t i = 0; i < graph.nodes.size(); ++i)
    if (!plan.input_why[i].empty()) note(graph.nodes[i].name, {}, plan.input_why[i]);
  const bool narrow_activations = support.activation != DType::kF32;
  if (!narrow_activations)
    for (size_t id = 0; id < graph.values.size(); ++id)
      if (!plan.weight_why[id].empty()) note({}, graph.values[id].name, plan.weight_why[id]);
  if (wide > 0)
    log.info("assign_precision[{}]: {} nodes compute in f32 (kiln inspect --layers says why)",
             graph.name, wide);
  // W8A8's input scales by node name: storing the weights inserts and removes nodes.
  std::map<std::string, float> scale_of;
  int kept_f32_inputs = 0;
  for (size_t i = 0; i < plan.input_scale.size(); ++i) {
    if (plan.input_scale[i] >= 0.0f) scale_of[graph.nodes[i].name] = plan.input_scale[i];
    kept_f32_inputs += !plan.input_why[i].empty();
  }
  const int stored =
      narrow_activations ? narrow_graph(graph, plan, log) : store_weights(graph, plan, log);
  if (support.calibrated_inputs)
    attach_input_scales(graph, scale_of, kept_f32_inputs, options.calibration_source, log);
  return stored;
}

}  // namespace kiln
