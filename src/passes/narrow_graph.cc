// fp16 / bf16 plans on CUDA: every float weight and activation of a graph takes the plan's type,
// and the decoder's logits go back to f32 through one Cast at the end (sampling, log-softmax and
// beam scores read f32). What must stay wide stays wide inside the kernels: GEMMs accumulate in
// fp32, norms and softmax compute their statistics in fp32, attention keeps scores and its online
// softmax in fp32. Runs after constant folding (weights are concrete) and before plan_memory
// (buffer sizes depend on the types).
//
// fp16 T5 overflows: on real Flan-T5 checkpoints the FFN output projection `wo` and the residual
// stream exceed fp16's 65504. In fp16 graphs with RMSNorm (the T5 family), the residual stream
// stays f32 as HuggingFace keeps it: the `wo` Linears (f32 weights, as HF's
// _keep_in_fp32_modules), the residual adds and the norms compute in f32, and Casts move values
// between the f32 stream and the fp16 layers around it (a norm's output is cast to fp16 for the
// Linears that read it, an fp16 attention output to f32 for the add). The build log says so.
#include <algorithm>
#include <map>
#include <string>

#include "passes/pass.h"

namespace kiln {
namespace {

bool is_float(DType d) { return d == DType::kF32 || d == DType::kF16 || d == DType::kBF16; }

bool is_wo(const Graph& g, const Node& n) {
  if (n.op != OpKind::kLinear || n.inputs.size() < 2 || n.inputs[1] < 0) return false;
  // A weight the frontend widened (a checkpoint of another narrow type) is named after its
  // folded Cast: "<name>.f32".
  const std::string& w = g.values[n.inputs[1]].name;
  auto ends_with = [&](std::string_view suffix) {
    return w.size() >= suffix.size() &&
           w.compare(w.size() - suffix.size(), suffix.size(), suffix.data(), suffix.size()) == 0;
  };
  return ends_with(".wo.weight") || ends_with(".wo.weight.f32");
}

// The nodes of the f32 residual stream: norms, `wo` Linears, and the adds and row gathers that
// read the stream.
std::vector<bool> residual_nodes(const Graph& g) {
  std::vector<bool> wide(g.nodes.size(), false);
  std::vector<bool> wide_value(g.values.size(), false);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& n = g.nodes[i];
    bool w = n.op == OpKind::kRmsNorm || n.op == OpKind::kAddRmsNorm || is_wo(g, n);
    // Adds and row gathers of the stream stay in it (a gather of the last rows before the
    // final norm must not round the stream to fp16).
    if (n.op == OpKind::kAdd || n.op == OpKind::kGatherRows)
      for (int in : n.inputs) w = w || (in >= 0 && wide_value[in]);
    wide[i] = w;
    if (w)
      for (int out : n.outputs) wide_value[out] = true;
  }
  return wide;
}

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

int narrow_graph(Graph& graph, Precision precision, const Logger& log) {
  DType narrow = DType::kF32;
  switch (precision) {
    case Precision::kFp32:
      return 0;
    case Precision::kFp16:
      narrow = DType::kF16;
      break;
    case Precision::kBf16:
      narrow = DType::kBF16;
      break;
    case Precision::kInt8:
    case Precision::kInt8Weight:
      KILN_FAIL("graph '{}': narrow_graph handles fp32, fp16 and bf16, not {}", graph.name,
                precision_name(precision));
  }
  // fp16 T5: the residual stream's nodes stay f32 (bf16 has f32's range).
  bool has_rms = false;
  for (const Node& n : graph.nodes)
    has_rms |= n.op == OpKind::kRmsNorm || n.op == OpKind::kAddRmsNorm;
  std::vector<bool> wide(graph.nodes.size(), false);
  if (narrow == DType::kF16 && has_rms) wide = residual_nodes(graph);
  std::vector<bool> keep(graph.values.size(), false);  // values that stay f32
  int kept_weights = 0;
  for (size_t i = 0; i < graph.nodes.size(); ++i) {
    if (!wide[i]) continue;
    const Node& n = graph.nodes[i];
    for (int out : n.outputs) keep[out] = true;
    if (n.op == OpKind::kLinear)
      for (size_t k = 1; k < n.inputs.size(); ++k)
        if (n.inputs[k] >= 0 && !keep[n.inputs[k]]) {
          keep[n.inputs[k]] = true;
          ++kept_weights;
        }
  }
  int weights = 0, activations = 0;
  for (size_t id = 0; id < graph.values.size(); ++id) {
    Value& v = graph.values[id];
    if (!is_float(v.dtype)) continue;
    if (keep[id]) {
      if (v.kind == ValueKind::kWeight && v.dtype != DType::kF32) {
        KILN_CHECK(v.layout.plain(),
                   "graph '{}': weight '{}' is packed ({}); assign precision "
                   "before packing",
                   graph.name, v.name, v.layout.packing);
        graph.set_weight_data(static_cast<int>(id), v.data.to(DType::kF32));
      }
      v.dtype = DType::kF32;
      continue;
    }
    if (v.dtype == narrow) {
      weights += v.kind == ValueKind::kWeight;  // kept in the checkpoint's type
      activations += v.kind == ValueKind::kActivation;
      continue;
    }
    switch (v.kind) {
      case ValueKind::kWeight:
        KILN_CHECK(v.layout.plain(),
                   "graph '{}': weight '{}' is packed ({}); assign precision "
                   "before packing",
                   graph.name, v.name, v.layout.packing);
        graph.set_weight_data(static_cast<int>(id), v.data.to(narrow));
        v.dtype = narrow;
        ++weights;
        break;
      case ValueKind::kActivation:
        v.dtype = narrow;
        ++activations;
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
        "graph '{}': fp16 overflows on T5's residual stream: kept {} nodes (norms, residual "
        "adds, the FFN output projections wo) and {} wo weights in f32, with {} casts between "
        "them and the fp16 layers",
        graph.name, stream_nodes, kept_weights, casts);
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
  log.info("graph '{}': {} precision: {} weights and {} activations in {}, logits in f32",
           graph.name, precision_name(precision), weights, activations, dtype_name(narrow));
  return weights + activations;
}

}  // namespace kiln
