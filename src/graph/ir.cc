#include "graph/ir.h"

#include <sstream>

namespace kiln {

std::string sym_shape_str(const SymShape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += shape[i].is_symbolic() ? shape[i].symbol : std::to_string(shape[i].value);
  }
  return s + "]";
}

Shape resolve_shape(const SymShape& shape, const std::map<std::string, int64_t>& bindings) {
  Shape out;
  out.reserve(shape.size());
  for (const Dim& d : shape) {
    if (!d.is_symbolic()) {
      out.push_back(d.value);
      continue;
    }
    auto it = bindings.find(d.symbol);
    KILN_CHECK(it != bindings.end(), "shape symbol '{}' is not bound", d.symbol);
    out.push_back(it->second);
  }
  return out;
}

int Graph::find_value(std::string_view value_name) const {
  for (size_t i = 0; i < values.size(); ++i)
    if (values[i].name == value_name) return static_cast<int>(i);
  return -1;
}

int Graph::output(std::string_view value_name) const {
  for (int id : outputs)
    if (values[id].name == value_name) return id;
  KILN_FAIL("graph '{}' has no output named '{}'", name, value_name);
}

int64_t Graph::weight_bytes() const {
  int64_t total = 0;
  for (const Value& v : values)
    if (v.kind == ValueKind::kWeight) total += static_cast<int64_t>(v.data.nbytes());
  return total;
}

std::string_view attention_kind_name(AttentionKind k) {
  switch (k) {
    case AttentionKind::kEncoderSelf:
      return "encoder_self";
    case AttentionKind::kCachedSelf:
      return "cached_self";
    case AttentionKind::kCross:
      return "cross";
  }
  return "?";
}

std::string_view position_bias_name(PositionBias b) {
  switch (b) {
    case PositionBias::kNone:
      return "none";
    case PositionBias::kT5Relative:
      return "t5_relative";
    case PositionBias::kAlibi:
      return "alibi";
  }
  return "?";
}

std::string dump_graph(const Graph& graph) {
  std::ostringstream out;
  auto describe = [&](int id) {
    if (id < 0) return std::string("-");
    const Value& v = graph.values[id];
    return fmt::format("%{}:{}{}", v.name, dtype_name(v.dtype), sym_shape_str(v.shape));
  };
  out << "graph " << graph.name << " (" << graph.nodes.size() << " nodes, " << graph.weight_bytes()
      << " weight bytes)\n";
  for (int id : graph.inputs) out << "  input  " << describe(id) << "\n";
  for (const Node& n : graph.nodes) {
    std::vector<std::string> ins, outs;
    for (int id : n.inputs) {
      if (id >= 0 && graph.values[id].kind == ValueKind::kWeight)
        ins.push_back("@" + graph.values[id].name);
      else
        ins.push_back(describe(id));
    }
    for (int id : n.outputs) outs.push_back(describe(id));
    std::string attrs;
    if (n.op == OpKind::kLinear && n.attrs.has_activation)
      attrs = fmt::format(" act={}", activation_name(n.attrs.activation));
    if (n.op == OpKind::kActivation || n.op == OpKind::kGatedActivation)
      attrs = fmt::format(" act={}", activation_name(n.attrs.activation));
    if (n.op == OpKind::kScale) attrs = fmt::format(" scale={}", n.attrs.scale);
    if (n.op == OpKind::kRmsNorm || n.op == OpKind::kLayerNorm || n.op == OpKind::kAddRmsNorm)
      attrs = fmt::format(" eps={}", n.attrs.eps);
    if (n.op == OpKind::kCast) attrs = fmt::format(" to={}", dtype_name(n.attrs.dtype));
    if (n.op == OpKind::kAttention) {
      const AttentionAttrs& a = n.attrs.attention;
      attrs = fmt::format(" kind={} layer={} heads={} head_dim={} causal={} scale={} bias={}{}",
                          attention_kind_name(a.kind), a.layer, a.num_heads, a.head_dim, a.causal,
                          a.scale, position_bias_name(a.bias), a.packed_qkv ? " packed" : "");
    }
    out << "  " << fmt::format("{:<16}", op_name(n.op)) << fmt::format("{}", fmt::join(outs, ", "))
        << " = " << n.name << "(" << fmt::format("{}", fmt::join(ins, ", ")) << ")" << attrs
        << "\n";
  }
  for (int id : graph.outputs) out << "  output " << describe(id) << "\n";
  return out.str();
}

}  // namespace kiln
