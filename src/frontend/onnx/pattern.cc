#include "frontend/onnx/pattern.h"

#include <algorithm>
#include <cstring>

#include "frontend/onnx/interp/op_context.h"
#include "frontend/onnx/interp/run_node.h"
#include "io/weight_spill.h"

namespace kiln {

namespace {

// Depth first from the producer of value v toward the graph's inputs: visit(node) once for each
// node reached, in the order reached; a value for which stop(value) holds is not entered.
template <typename Stop, typename Visit>
void walk_upstream(const ImportGraph& graph, int v, Stop stop, Visit visit) {
  std::vector<bool> seen(graph.nodes().size(), false);
  std::vector<int> stack;
  auto push = [&](int value) {
    if (value < 0 || stop(value)) return;
    const int n = graph.values()[value].producer;
    if (n >= 0 && !seen[n]) {
      seen[n] = true;
      stack.push_back(n);
    }
  };
  push(v);
  while (!stack.empty()) {
    const int n = stack.back();
    stack.pop_back();
    visit(n);
    for (int in : graph.nodes()[n].inputs) push(in);
  }
}

}  // namespace

PatternGraph::PatternGraph(const ImportGraph& graph,
                           const std::map<std::string, Shape>& probe_shapes)
    : graph_(graph),
      probe_shapes_(probe_shapes),
      constants_(fold_import_graph(graph)),
      probe_(fold_import_graph(graph, probe_shapes, /*keep_all_data=*/true)),
      users_(graph.values().size()) {
  // The probe fold's data is read for what the inputs' sizes determine (positions, masks);
  // constants are the first fold's (folded fp16 -> fp32 weight casts are not kept twice).
  for (size_t v = 0; v < probe_.known.size(); ++v)
    if (probe_.known[v].has_data() && constants_.known[v].has_data())
      probe_.known[v] = ImportTensor::shape_only(probe_.known[v].type(), probe_.known[v].shape());
  for (int n : graph.order())
    for (int v : graph.nodes()[n].inputs)
      if (v >= 0 && (users_[v].empty() || users_[v].back() != n)) users_[v].push_back(n);
  find_overflow_clamps();
}

void PatternGraph::find_overflow_clamps() {
  clamps_.assign(graph_.nodes().size(), {});
  static constexpr std::string_view kBoundOps[] = {"Cast",     "IsInf", "ReduceSum", "ReduceMax",
                                                   "Greater",  "Where", "Neg",       "Not",
                                                   "Identity", "Sub"};
  for (int n : graph_.order()) {
    const ImportNode& clip = graph_.nodes()[n];
    if (clip.op_type != "Clip" || clip.inputs.size() != 3 || clip.inputs[0] < 0 ||
        clip.inputs[1] < 0 || clip.inputs[2] < 0)
      continue;
    const int x = clip.inputs[0], lo = clip.inputs[1], hi = clip.inputs[2];
    const std::optional<Shape> shape = probe_shape(x);
    if (!shape || !is_float_type(probe_type(x))) continue;
    std::vector<int> chain = nodes_between(lo, {x});
    for (int m : nodes_between(hi, {x}))
      if (std::find(chain.begin(), chain.end(), m) == chain.end()) chain.push_back(m);
    bool ok = !chain.empty(), tests_x = false;
    for (int m : chain) {
      const ImportNode& node = graph_.nodes()[m];
      ok = ok && std::find(std::begin(kBoundOps), std::end(kBoundOps), node.op_type) !=
                     std::end(kBoundOps);
      tests_x = tests_x ||
                (node.op_type == "IsInf" && through_casts(node.inputs.at(0)) == through_casts(x));
      for (int in : node.inputs) {
        const int p = in < 0 ? -1 : graph_.values()[in].producer;
        ok = ok && (in < 0 || in == x || constant(in) ||
                    (p >= 0 && std::find(chain.begin(), chain.end(), p) != chain.end()));
      }
    }
    if (!ok || !tests_x) continue;
    const std::map<int, ImportTensor> bound{{x, ImportTensor::zeros(probe_type(x), *shape)}};
    std::vector<float> l, h;
    try {
      l = evaluate(lo, bound).to_floats();
      h = evaluate(hi, bound).to_floats();
    } catch (const Error&) {
      continue;
    }
    constexpr float kFp16Max = 65504.0f;
    if (l.size() != 1 || h.size() != 1 || !(h[0] >= kFp16Max - 2000.0f) || l[0] != -h[0]) continue;
    chain.push_back(n);
    std::sort(chain.begin(), chain.end());
    clamps_[n] = std::move(chain);
  }
}

int PatternGraph::through_casts(int v) const {
  while (v >= 0 && !constant(v)) {
    const int n = graph_.values()[v].producer;
    if (n < 0) break;
    const ImportNode& node = graph_.nodes()[n];
    if (node.op_type == "Identity" || !clamps_[n].empty()) {
      v = node.inputs.at(0);
      continue;
    }
    if (node.op_type != "Cast") break;
    const ImportTensor& in = probe_.known[node.inputs.at(0)];
    const ImportTensor& out = probe_.known[v];
    if (!in.has_shape() || !out.has_shape() || !is_float_type(in.type()) ||
        !is_float_type(out.type()))
      break;
    v = node.inputs.at(0);
  }
  return v;
}

int PatternGraph::producer(int v) const {
  v = through_casts(v);
  if (v < 0 || constant(v)) return -1;
  return graph_.values()[v].producer;
}

int PatternGraph::producer_if(int v, std::string_view op) const {
  const int n = producer(v);
  return n >= 0 && graph_.nodes()[n].op_type == op ? n : -1;
}

std::vector<int> PatternGraph::data_users(int v) const {
  std::vector<int> out;
  for (int n : users_[v])
    if (graph_.nodes()[n].op_type != "Shape") out.push_back(n);
  return out;
}

int PatternGraph::sole_user(int v, std::string_view op) const {
  int found = -1;
  for (int n : users_[v]) {
    const ImportNode& node = graph_.nodes()[n];
    if (node.op_type == "Identity" || (!clamps_[n].empty() && node.inputs[0] == v) ||
        (node.op_type == "Cast" && through_casts(node.outputs[0]) == through_casts(v))) {
      const int inner = sole_user(node.outputs[0], op);
      if (inner >= 0) {
        if (found >= 0) return -1;
        found = inner;
      }
      continue;
    }
    if (node.op_type != op) continue;
    if (found >= 0) return -1;
    found = n;
  }
  return found;
}

const ImportTensor* PatternGraph::constant(int v) const {
  if (v < 0) return nullptr;
  const ImportTensor& t = constants_.known[v];
  if (t.has_data()) return &t;
  const int n = graph_.values()[v].producer;
  // A Cast or Identity of a constant is one too (fp16 weights widened by Cast).
  if (n >= 0 && constants_.folded[n]) {
    const ImportNode& node = graph_.nodes()[n];
    if (node.op_type == "Identity" || node.op_type == "Cast") return constant(node.inputs.at(0));
  }
  return nullptr;
}

std::optional<double> PatternGraph::scalar(int v) const {
  const ImportTensor* t = constant(v);
  if (!t || t->numel() != 1) return std::nullopt;
  return static_cast<double>(t->to_floats().at(0));
}

int PatternGraph::non_constant_input(int n) const {
  const ImportNode& node = graph_.nodes()[n];
  if (node.inputs.size() != 2) return -1;
  const bool c0 = constant(node.inputs[0]) != nullptr, c1 = constant(node.inputs[1]) != nullptr;
  if (c0 == c1) return -1;
  return c0 ? 1 : 0;
}

std::optional<Shape> PatternGraph::probe_shape(int v) const {
  if (v < 0 || !probe_.known[v].has_shape()) return std::nullopt;
  return probe_.known[v].shape();
}

OnnxElemType PatternGraph::probe_type(int v) const {
  return v >= 0 && probe_.known[v].has_shape() ? probe_.known[v].type() : OnnxElemType::kUndefined;
}

std::vector<int> PatternGraph::upstream_nodes(int v) const {
  std::vector<int> out;
  walk_upstream(
      graph_, v, [&](int value) { return constant(value); }, [&](int n) { out.push_back(n); });
  return out;
}

bool PatternGraph::upstream_has(int v, std::string_view op) const {
  for (int n : upstream_nodes(v))
    if (graph_.nodes()[n].op_type == op) return true;
  return false;
}

bool PatternGraph::depends_on_input(int v, const std::string& input) const {
  const int target = graph_.find_value(input);
  if (target < 0) return false;
  if (v == target) return true;
  for (int n : upstream_nodes(v))
    for (int in : graph_.nodes()[n].inputs)
      if (in == target) return true;
  return false;
}

std::vector<int> PatternGraph::region(int from, int to) const {
  // Nodes `to` depends on that depend on `from`: walk back from `to`, keep what reaches `from`.
  const std::vector<int> up = upstream_nodes(to);
  std::vector<bool> in_up(graph_.nodes().size(), false);
  for (int n : up) in_up[n] = true;
  std::vector<bool> reaches(graph_.values().size(), false);
  reaches[from] = true;
  std::vector<int> out;
  for (int n : graph_.order()) {
    if (!in_up[n]) continue;
    bool r = false;
    for (int in : graph_.nodes()[n].inputs) r = r || (in >= 0 && reaches[in]);
    if (!r) continue;
    for (int o : graph_.nodes()[n].outputs)
      if (o >= 0) reaches[o] = true;
    out.push_back(n);
  }
  if (!reaches[to]) return {};
  return out;
}

bool PatternGraph::region_is_closed(const std::vector<int>& nodes, int output, int input) const {
  std::vector<bool> inside(graph_.nodes().size(), false);
  for (int n : nodes) inside[n] = true;
  for (int n : nodes)
    for (int o : graph_.nodes()[n].outputs) {
      if (o < 0 || o == output) continue;
      if (input >= 0 && through_casts(o) == through_casts(input)) continue;
      if (graph_.values()[o].is_output) return false;
      for (int u : users_[o])
        if (!inside[u]) return false;
    }
  return true;
}

ImportTensor PatternGraph::run_region(const std::vector<int>& nodes, int input,
                                      const ImportTensor& x, int output) const {
  std::map<int, ImportTensor> computed;
  computed[input] = x;
  for (int n : nodes) {
    const ImportNode& node = graph_.nodes()[n];
    std::vector<const ImportTensor*> ins;
    for (int v : node.inputs) {
      if (v < 0) {
        ins.push_back(nullptr);
      } else if (auto it = computed.find(v); it != computed.end()) {
        ins.push_back(&it->second);
      } else if (const ImportTensor* c = constant(v)) {
        ins.push_back(c);
      } else {
        KILN_CHECK(false,
                   "node '{}' reads '{}', which is neither computed in the pattern nor a "
                   "constant",
                   node.name, graph_.values()[v].name);
      }
    }
    std::vector<ImportTensor> outs;
    try {
      outs = run_import_node(graph_, n, ins);
    } catch (const ValueNotKnown&) {
      KILN_CHECK(false, "node '{}' could not run on probe data", node.name);
    }
    for (size_t i = 0; i < outs.size(); ++i)
      if (node.outputs[i] >= 0) computed[node.outputs[i]] = std::move(outs[i]);
  }
  const auto it = computed.find(output);
  KILN_CHECK(it != computed.end(), "the pattern does not compute '{}'",
             graph_.values()[output].name);
  return it->second;
}

std::vector<int> PatternGraph::nodes_between(int v, const std::vector<int>& stops,
                                             bool stop_at_probe_data) const {
  std::vector<bool> seen(graph_.nodes().size(), false), stop(graph_.values().size(), false);
  for (int s : stops) stop[s] = true;
  walk_upstream(
      graph_, v,
      [&](int value) {
        return stop[value] || constant(value) ||
               (stop_at_probe_data && probe_.known[value].has_data());
      },
      [&](int n) { seen[n] = true; });
  std::vector<int> out;
  for (int n : graph_.order())
    if (seen[n]) out.push_back(n);
  return out;
}

ImportTensor PatternGraph::evaluate(int v, const std::map<int, ImportTensor>& bound) const {
  std::vector<int> stops;
  for (const auto& [value, t] : bound) stops.push_back(value);
  std::map<int, ImportTensor> computed = bound;
  for (int in : graph_.inputs()) {
    if (computed.count(in)) continue;
    const ImportValue& value = graph_.values()[in];
    const auto shape = probe_shapes_.find(value.name);
    KILN_CHECK(shape != probe_shapes_.end(), "no probe shape for input '{}'", value.name);
    ImportTensor t = ImportTensor::zeros(value.type, shape->second);
    if (value.type == OnnxElemType::kInt64) {
      int64_t* p = t.mutable_data<int64_t>();
      std::fill(p, p + t.numel(), int64_t{1});
    } else if (value.type == OnnxElemType::kInt32) {
      int32_t* p = t.mutable_data<int32_t>();
      std::fill(p, p + t.numel(), 1);
    }
    computed[in] = std::move(t);
  }
  const std::vector<int> nodes = nodes_between(v, stops, /*stop_at_probe_data=*/true);
  for (int n : nodes) {
    const ImportNode& node = graph_.nodes()[n];
    std::vector<const ImportTensor*> ins;
    for (int value : node.inputs) {
      if (value < 0) {
        ins.push_back(nullptr);
      } else if (auto it = computed.find(value); it != computed.end()) {
        ins.push_back(&it->second);
      } else if (probe_.known[value].has_data()) {
        ins.push_back(&probe_.known[value]);
      } else {
        const ImportTensor* c = constant(value);
        KILN_CHECK(c, "node '{}' reads '{}', which is not known on probe data", node.name,
                   graph_.values()[value].name);
        ins.push_back(c);
      }
    }
    std::vector<ImportTensor> outs;
    try {
      outs = run_import_node(graph_, n, ins);
    } catch (const ValueNotKnown&) {
      KILN_CHECK(false, "node '{}' could not run on probe data", node.name);
    }
    for (size_t i = 0; i < outs.size(); ++i)
      if (node.outputs[i] >= 0) computed[node.outputs[i]] = std::move(outs[i]);
  }
  if (const ImportTensor* c = constant(v); c && !computed.count(v)) return *c;
  if (!computed.count(v) && probe_.known[v].has_data()) return probe_.known[v];
  const auto it = computed.find(v);
  KILN_CHECK(it != computed.end(), "'{}' is not computed on probe data", graph_.values()[v].name);
  return it->second;
}

namespace {

// dst [cols, rows] = src [rows, cols]^T for elements of type E, in 64 x 64 tiles so that both
// sides are read and written a cache line at a time.
template <typename E>
void transpose_tiles(const E* src, E* dst, int64_t rows, int64_t cols) {
  constexpr int64_t kTile = 64;
  for (int64_t r0 = 0; r0 < rows; r0 += kTile)
    for (int64_t c0 = 0; c0 < cols; c0 += kTile) {
      const int64_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
      for (int64_t c = c0; c < c1; ++c)
        for (int64_t r = r0; r < r1; ++r) dst[c * rows + r] = src[r * cols + c];
    }
}

}  // namespace

Tensor transposed_2d(const ImportTensor& t) {
  KILN_CHECK(t.rank() == 2, "expected a 2-D weight, got {}", t.describe());
  const Tensor src = t.to_kiln();
  const int64_t rows = t.dim(0), cols = t.dim(1);
  Tensor out = Tensor::empty(src.dtype(), {cols, rows});
  switch (dtype_bytes(src.dtype(), 1)) {
    case 4:
      transpose_tiles(static_cast<const uint32_t*>(src.raw()), static_cast<uint32_t*>(out.raw()),
                      rows, cols);
      break;
    case 2:
      transpose_tiles(static_cast<const uint16_t*>(src.raw()), static_cast<uint16_t*>(out.raw()),
                      rows, cols);
      break;
    case 1:
      transpose_tiles(static_cast<const uint8_t*>(src.raw()), static_cast<uint8_t*>(out.raw()),
                      rows, cols);
      break;
    default:
      KILN_CHECK(false, "a {} weight cannot be transposed", t.describe());
  }
  if (WeightSpill* spill = WeightSpill::active()) return spill->put(std::move(out));
  return out;
}

}  // namespace kiln
