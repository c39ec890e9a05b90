// The precision pass on narrow-activation devices (CUDA fp16/bf16/int8-weight plans): every float
// weight and activation of a graph takes the plan's type except what precision_plan.cc kept wide
// (int8-weight: the matrices it quantizes are stored int8 with per-row scales), and
// the decoder's logits go back to f32 through one Cast at the end (sampling, log-softmax and beam
// scores read f32). What must stay wide stays wide inside the kernels: GEMMs accumulate in fp32,
// norms and softmax compute their statistics in fp32, attention keeps scores and its online
// softmax in fp32. Runs after constant folding (weights are concrete) and before plan_memory
// (buffer sizes depend on the types). Casts move values between wide nodes (fp16 T5's f32
// residual stream: a norm's output is cast to fp16 for the Linears that read it, an fp16
// attention output to f32 for the add) and the narrow layers around them.
#include <algorithm>
#include <map>
#include <string>

#include "passes/precision_plan.h"

namespace kiln {
namespace {

bool is_float(DType d) { return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16; }

// Gives every node its inputs in the type it computes in (f32 for `wide` nodes, `narrow` for
// the others) through Casts inserted before it, one per value and type. Returns the casts made.
int insert_casts(Graph& g, const std::vector<bool>& wide, DType narrow) {
  std::vector<Node> nodes;
  std::map<std::pair<int, DType>, int> cast_of;
  int casts = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node n = std::move(g.nodes[i]);
    const DType want = wide[i] ? DType::kF32 : narrow;
    if (n.op != OpKind::kCast) {
      for (size_t k = 0; k < n.inputs.size(); ++k) {
        const int in = n.inputs[k];
        if (in < 0 || g.values[in].kind != ValueKind::kActivation) continue;
        const DType have = g.values[in].dtype;
        if (!is_float(have) || have == want) continue;
        auto [it, fresh] = cast_of.emplace(std::make_pair(in, want), -1);
        if (fresh) {
          Value v = g.values[in];
          v.name = g.values[in].name + "." + std::string(dtype_name(want));
          v.dtype = want;
          v.producer = static_cast<int>(nodes.size());
          it->second = static_cast<int>(g.values.size());
          g.values.push_back(std::move(v));
          nodes.push_back(
              Node{OpKind::kCast, g.values[it->second].name, {in}, {it->second}, CastAttrs{want}});
          ++casts;
        }
        n.inputs[k] = it->second;
      }
    }
    for (int out : n.outputs) g.values[out].producer = static_cast<int>(nodes.size());
    nodes.push_back(std::move(n));
  }
  g.nodes = std::move(nodes);
  return casts;
}

// Casts whose input already has their type (an Embedding's widening Cast from
// keep_narrow_weights, once both sides are narrow): their readers read the input. A Cast that
// makes a graph output stays (the output keeps its name). `wide` follows the removal.
void remove_identity_casts(Graph& g, std::vector<bool>* wide) {
  std::vector<bool> erase(g.nodes.size(), false);
  std::vector<int> same(g.values.size(), -1);
  bool any = false;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& n = g.nodes[i];
    for (int& in : n.inputs)
      if (in >= 0 && same[in] >= 0) in = same[in];
    if (n.op != OpKind::kCast || g.values[n.inputs[0]].dtype != g.values[n.outputs[0]].dtype)
      continue;
    const int out = n.outputs[0];
    if (std::find(g.outputs.begin(), g.outputs.end(), out) != g.outputs.end()) continue;
    same[out] = n.inputs[0];
    erase[i] = any = true;
  }
  if (!any) return;
  std::vector<bool> kept;
  for (size_t i = 0; i < erase.size(); ++i)
    if (!erase[i]) kept.push_back((*wide)[i]);
  remove_nodes(g, erase);
  *wide = std::move(kept);
}

}  // namespace

int narrow_graph(Graph& graph, const PrecisionPlan& plan, const Logger& log) {
  const DType narrow = plan.support->activation;
  std::vector<bool> wide = plan.wide;  // follows remove_identity_casts
  // An Embedding of a quantized table gathers f32 rows (op_registry: infer_embedding); Casts
  // narrow them for the layers after it.
  for (size_t i = 0; i < graph.nodes.size(); ++i)
    if (graph.nodes[i].op == OpKind::kEmbedding &&
        plan.weight[graph.nodes[i].inputs[0]] == DType::kI8)
      wide[i] = true;
  const size_t num_values = graph.values.size();  // quantized weights' scales are appended
  std::vector<bool> keep(num_values, false);      // activations that stay f32
  for (size_t i = 0; i < graph.nodes.size(); ++i)
    if (wide[i])
      for (int out : graph.nodes[i].outputs) keep[out] = true;
  int weights = 0, activations = 0, kept_weights = 0, quantized = 0, int4 = 0, fp8 = 0;
  for (size_t id = 0; id < num_values; ++id) {
    Value& v = graph.values[id];
    if (!is_float(v.dtype)) continue;
    switch (v.kind) {
      case ValueKind::kWeight: {
        const DType to = plan.weight[id];
        if (to == DType::kI8 || to == DType::kI4 || to == DType::kF8E4M3) {
          KILN_CHECK(v.layout.plain(),
                     "graph '{}': weight '{}' is packed ({}); assign precision before packing",
                     graph.name, v.name, v.layout.packing);
          quantize_weight(graph, static_cast<int>(id), to);  // appends to graph.values
          ++quantized;
          int4 += to == DType::kI4;
          fp8 += to == DType::kF8E4M3;
          break;
        }
        if (v.dtype != to) {
          KILN_CHECK(v.layout.plain(),
                     "graph '{}': weight '{}' is packed ({}); assign precision before packing",
                     graph.name, v.name, v.layout.packing);
          graph.set_weight_data(static_cast<int>(id), v.data.to(to));
          v.dtype = to;
        }
        weights += to == narrow;
        kept_weights += to == DType::kF32;
        break;
      }
      case ValueKind::kActivation:
        v.dtype = keep[id] ? DType::kF32 : narrow;
        activations += !keep[id];
        break;
      case ValueKind::kInput:
        break;  // the graph contract's inputs are token ids and rows
    }
  }
  for (Node& n : graph.nodes)
    if (n.op == OpKind::kCast) n.attr<CastAttrs>().to = graph.values[n.outputs[0]].dtype;
  remove_identity_casts(graph, &wide);
  const int stream_nodes = static_cast<int>(std::count(wide.begin(), wide.end(), true));
  if (stream_nodes > 0) {
    const int casts = insert_casts(graph, wide, narrow);
    log.info(
        "graph '{}': kept {} nodes (fp16 T5's residual stream norms and adds and FFN output "
        "projections; the embeddings of int8 tables) and {} weights in f32, with {} casts "
        "between them and the {} layers",
        graph.name, stream_nodes, kept_weights, casts, dtype_name(narrow));
  }
  // The logits output, computed in the narrow type, widened to f32 by one Cast.
  const int logits = graph.find_value("logits");
  const auto out = std::find(graph.outputs.begin(), graph.outputs.end(), logits);
  if (logits >= 0 && out != graph.outputs.end() && graph.values[logits].dtype == narrow) {
    Value wide = graph.values[logits];
    graph.values[logits].name = "logits." + std::string(dtype_name(narrow));
    wide.dtype = DType::kF32;
    wide.producer = static_cast<int>(graph.nodes.size());
    const int wide_id = static_cast<int>(graph.values.size());
    graph.values.push_back(std::move(wide));
    graph.nodes.push_back(
        Node{OpKind::kCast, "logits_to_f32", {logits}, {wide_id}, CastAttrs{DType::kF32}});
    *out = wide_id;
  }
  log.info(
      "graph '{}': {} precision: {} weights and {} activations in {}{}, logits in f32", graph.name,
      precision_name(plan.support->precision), weights, activations, dtype_name(narrow),
      quantized > 0
          ? fmt::format(
                "; {} weight matrices in int8 with per-row f32 scales{}{}", quantized - int4 - fp8,
                int4 > 0 ? fmt::format(", {} in int4 with f16 scales per group of 128", int4)
                         : std::string(),
                fp8 > 0 ? fmt::format(", {} in fp8 (E4M3) with per-row f32 scales", fp8)
                        : std::string())
          : std::string());
  return weights + activations + quantized;
}

}  // namespace kiln
