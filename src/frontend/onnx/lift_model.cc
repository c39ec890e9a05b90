#include "frontend/onnx/lift_model.h"

#include <algorithm>
#include <cstring>
#include <set>
#include <vector>

namespace kiln {

bool same_values(const Tensor& a, const Tensor& b) {
  if (a.shape() != b.shape()) return false;
  KILN_CHECK(a.is_contiguous() && b.is_contiguous(), "same_values of non-contiguous tensors");
  if (a.dtype() == b.dtype()) return std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
  // Of two types: as floats, a chunk at a time (a tied embedding of a real export is 0.5-1 GB:
  // no whole f32 copies of both).
  const DTypeTraits& ta = dtype_traits(a.dtype());
  const DTypeTraits& tb = dtype_traits(b.dtype());
  KILN_CHECK(ta.to_float != nullptr && tb.to_float != nullptr, "same_values of {} and {}",
             dtype_name(a.dtype()), dtype_name(b.dtype()));
  const size_t n = static_cast<size_t>(a.numel());
  const size_t chunk = static_cast<size_t>(ta.block_elems) * tb.block_elems * 4096;
  std::vector<float> fa(chunk), fb(chunk);
  const char* pa = static_cast<const char*>(a.raw());
  const char* pb = static_cast<const char*>(b.raw());
  for (size_t i = 0; i < n; i += chunk) {
    const size_t m = std::min(chunk, n - i);
    ta.to_float(pa + dtype_bytes(a.dtype(), i), fa.data(), m);
    tb.to_float(pb + dtype_bytes(b.dtype(), i), fb.data(), m);
    if (std::memcmp(fa.data(), fb.data(), m * sizeof(float)) != 0) return false;
  }
  return true;
}

std::map<std::string, Shape> lift_probe_shapes(const ImportGraph& graph) {
  std::map<std::string, int64_t> sizes;
  const int64_t others[] = {40, 33, 27, 23, 19};
  size_t next = 0;
  std::map<std::string, Shape> shapes;
  for (int v : graph.inputs()) {
    const ImportValue& value = graph.values()[v];
    KILN_CHECK(value.shape, "{}: input '{}' has no declared shape", graph.path(), value.name);
    Shape s;
    for (size_t i = 0; i < value.shape->size(); ++i) {
      const OnnxDim& d = (*value.shape)[i];
      if (d.is_static()) {
        s.push_back(d.value);
        continue;
      }
      auto it = sizes.find(d.param);
      if (it == sizes.end()) {
        const int64_t size = i == 0 ? 2 : others[std::min(next++, std::size(others) - 1)];
        it = sizes.emplace(d.param, size).first;
      }
      s.push_back(it->second);
    }
    shapes[value.name] = s;
  }
  // Exports whose dynamic axes were given as lists (torch names each input's axes apart:
  // input_ids_dynamic_axes_2, attention_mask_dynamic_axes_2) still mean one sequence: a mask
  // takes the length of what it masks, whatever its axis is called.
  for (const auto& [mask, of] : {std::pair<std::string, std::string>{"attention_mask", "input_ids"},
                                 {"encoder_attention_mask", "encoder_hidden_states"}}) {
    const int m = graph.find_value(mask), t = graph.find_value(of);
    if (m < 0 || t < 0 || !shapes.count(mask) || !shapes.count(of)) continue;
    const std::vector<OnnxDim>& md = *graph.values()[m].shape;
    const std::vector<OnnxDim>& td = *graph.values()[t].shape;
    if (md.size() >= 2 && td.size() >= 2 && !md[1].is_static() && !td[1].is_static())
      shapes[mask][1] = shapes[of][1];
  }
  return shapes;
}

Assembly::Assembly(const PatternGraph& graph, const LiftResult& l, std::string w)
    : g(graph), lifted(l), what(std::move(w)) {}

void Assembly::fail(const std::string& step, const std::string& reason) const {
  std::string text = fmt::format("{}: the graph does not lift into a {}: {}: {}", g.graph().path(),
                                 what, step, reason);
  if (!lifted.failures.empty()) {
    text += "\npatterns that did not match:";
    for (const PatternFailure& f : lifted.failures)
      text += fmt::format("\n  {} at node '{}': {}", f.pattern, f.node, f.reason);
  }
  KILN_FAIL("{}", text);
}

const LiftedOp* Assembly::find_op_reading(int value, LiftedKind kind) const {
  for (const LiftedOp& op : lifted.ops)
    if (op.kind == kind && g.through_casts(op.input) == g.through_casts(value)) return &op;
  return nullptr;
}

const LiftedOp& Assembly::op_reading(int value, LiftedKind kind, const std::string& step) {
  const LiftedOp* op = find_op_reading(value, kind);
  if (!op) fail(step, fmt::format("no {} reads '{}'", lifted_kind_name(kind), g.value_name(value)));
  return *op;
}

int Assembly::add_partner(int a, int* add_node) const {
  a = g.through_casts(a);
  for (int n : g.users(a)) {
    const ImportNode& node = g.node(n);
    if (node.op_type != "Add" || node.inputs.size() != 2) continue;
    if (add_node) *add_node = n;
    return node.inputs[0] == a ? node.inputs[1] : node.inputs[0];
  }
  return -1;
}

int Assembly::add_of(int a, int b, const std::string& step) {
  int n = -1;
  const int partner = add_partner(a, &n);
  if (partner < 0 || g.through_casts(partner) != g.through_casts(b))
    fail(step, fmt::format("'{}' is not added to '{}' (a residual connection)", g.value_name(a),
                           g.value_name(b)));
  used_nodes.push_back(n);
  return g.node(n).outputs[0];
}

int Assembly::model_output(const std::string& name) {
  const std::vector<int>& outputs = g.graph().outputs();
  for (int v : outputs)
    if (g.value_name(v) == name) return v;
  if (outputs.size() == 1) return outputs[0];
  std::vector<std::string> names;
  for (int v : outputs) names.push_back("'" + g.value_name(v) + "'");
  fail("outputs", fmt::format("no output named '{}' among {}", name, fmt::join(names, ", ")));
}

void Assembly::check_all_lifted(int output) const {
  std::set<int> used(used_nodes.begin(), used_nodes.end());
  std::vector<std::string> left;
  for (int n : g.nodes_between(output, {})) {
    const ImportNode& node = g.node(n);
    if (lifted.op_of_node[n] >= 0 || used.count(n)) continue;
    if ((node.op_type == "Cast" || node.op_type == "Identity") &&
        g.through_casts(node.outputs[0]) != node.outputs[0])
      continue;
    left.push_back(fmt::format("'{}' ({})", node.name, node.op_type));
  }
  if (left.empty()) return;
  const size_t shown = std::min<size_t>(left.size(), 12);
  std::string list;
  for (size_t i = 0; i < shown; ++i) list += (i ? ", " : "") + left[i];
  fail("output '" + g.value_name(output) + "'",
       fmt::format("{} node(s) it depends on are not part of any lifted op: {}{}", left.size(),
                   list, left.size() > shown ? ", ..." : ""));
}

}  // namespace kiln
