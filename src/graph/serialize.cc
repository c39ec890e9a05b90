#include "graph/serialize.h"

#include "graph/verifier.h"

namespace kiln {

using nlohmann::json;

namespace {

json attrs_to_json(const NodeAttrs& a) {
  const AttentionAttrs& t = a.attention;
  return json{{"activation", static_cast<int>(a.activation)},
              {"has_activation", a.has_activation},
              {"scale", a.scale},
              {"eps", a.eps},
              {"dtype", std::string(dtype_name(a.dtype))},
              {"attention",
               {{"kind", static_cast<int>(t.kind)},
                {"bias", static_cast<int>(t.bias)},
                {"layer", t.layer},
                {"num_heads", t.num_heads},
                {"head_dim", t.head_dim},
                {"causal", t.causal},
                {"packed_qkv", t.packed_qkv},
                {"scale", t.scale},
                {"bidirectional_buckets", t.bidirectional_buckets},
                {"num_buckets", t.num_buckets},
                {"max_distance", t.max_distance}}}};
}

template <typename E>
E enum_in_range(int v, int count, const char* what, const std::string& source) {
  KILN_CHECK(v >= 0 && v < count, "{}: invalid {} value {}", source, what, v);
  return static_cast<E>(v);
}

NodeAttrs attrs_from_json(const json& j, const std::string& source) {
  NodeAttrs a;
  a.activation = enum_in_range<Activation>(j.at("activation").get<int>(), 4, "activation", source);
  a.has_activation = j.at("has_activation").get<bool>();
  a.scale = j.at("scale").get<float>();
  a.eps = j.at("eps").get<double>();
  a.dtype = parse_dtype(j.at("dtype").get<std::string>());
  const json& t = j.at("attention");
  AttentionAttrs& at = a.attention;
  at.kind = enum_in_range<AttentionKind>(t.at("kind").get<int>(), 3, "attention kind", source);
  at.bias = enum_in_range<PositionBias>(t.at("bias").get<int>(), 3, "position bias", source);
  at.layer = t.at("layer").get<int>();
  at.num_heads = t.at("num_heads").get<int>();
  at.head_dim = t.at("head_dim").get<int>();
  at.causal = t.at("causal").get<bool>();
  at.packed_qkv = t.at("packed_qkv").get<bool>();
  at.scale = t.at("scale").get<float>();
  at.bidirectional_buckets = t.at("bidirectional_buckets").get<bool>();
  at.num_buckets = t.at("num_buckets").get<int>();
  at.max_distance = t.at("max_distance").get<int>();
  KILN_CHECK(at.layer >= 0 && at.num_heads > 0 && at.head_dim > 0 && at.num_buckets > 0 &&
                 at.max_distance > 0,
             "{}: invalid attention attributes", source);
  return a;
}

}  // namespace

json graph_to_json(const Graph& g, const std::function<int(const Tensor&)>& blob_of) {
  json values = json::array();
  for (const Value& v : g.values) {
    json shape = json::array();
    for (const Dim& d : v.shape) {
      if (d.is_symbolic())
        shape.push_back(d.symbol);
      else
        shape.push_back(d.value);
    }
    json jv{{"name", v.name},
            {"dtype", std::string(dtype_name(v.dtype))},
            {"shape", shape},
            {"kind", static_cast<int>(v.kind)},
            {"producer", v.producer}};
    if (v.kind == ValueKind::kWeight) jv["blob"] = blob_of(v.data);
    values.push_back(std::move(jv));
  }
  json nodes = json::array();
  for (const Node& n : g.nodes)
    nodes.push_back({{"op", std::string(op_name(n.op))},
                     {"name", n.name},
                     {"inputs", n.inputs},
                     {"outputs", n.outputs},
                     {"attrs", attrs_to_json(n.attrs)}});
  return json{{"name", g.name},          {"values", values},     {"nodes", nodes},
              {"inputs", g.inputs},      {"outputs", g.outputs}, {"value_slot", g.value_slot},
              {"num_slots", g.num_slots}};
}

Graph graph_from_json(const json& j, const std::function<Tensor(int)>& tensor_of,
                      const std::string& source) {
  Graph g;
  try {
    g.name = j.at("name").get<std::string>();
    const std::string where = source + " graph '" + g.name + "'";
    for (const json& jv : j.at("values")) {
      Value v;
      v.name = jv.at("name").get<std::string>();
      v.dtype = parse_dtype(jv.at("dtype").get<std::string>());
      for (const json& d : jv.at("shape")) {
        if (d.is_string())
          v.shape.push_back(Dim::sym(d.get<std::string>()));
        else
          v.shape.push_back(Dim::of(d.get<int64_t>()));
      }
      v.kind = enum_in_range<ValueKind>(jv.at("kind").get<int>(), 3, "value kind", where);
      v.producer = jv.at("producer").get<int>();
      if (v.kind == ValueKind::kWeight) v.data = tensor_of(jv.at("blob").get<int>());
      g.values.push_back(std::move(v));
    }
    const int nv = static_cast<int>(g.values.size());
    auto ids = [&](const json& arr, const char* what) {
      std::vector<int> out = arr.get<std::vector<int>>();
      for (int id : out)
        KILN_CHECK(id >= -1 && id < nv, "{}: {} refers to value {} of {}", where, what, id, nv);
      return out;
    };
    for (const json& jn : j.at("nodes")) {
      Node n;
      const std::string op = jn.at("op").get<std::string>();
      KILN_CHECK(parse_op_name(op, &n.op), "{}: unknown op '{}'", where, op);
      n.name = jn.at("name").get<std::string>();
      n.inputs = ids(jn.at("inputs"), "node input");
      n.outputs = ids(jn.at("outputs"), "node output");
      n.attrs = attrs_from_json(jn.at("attrs"), where);
      g.nodes.push_back(std::move(n));
    }
    g.inputs = ids(j.at("inputs"), "graph input");
    g.outputs = ids(j.at("outputs"), "graph output");
    g.value_slot = j.at("value_slot").get<std::vector<int>>();
    g.num_slots = j.at("num_slots").get<int>();
    KILN_CHECK(g.value_slot.empty() || static_cast<int>(g.value_slot.size()) == nv,
               "{}: value_slot has {} entries for {} values", where, g.value_slot.size(), nv);
    for (int s : g.value_slot)
      KILN_CHECK(s >= -1 && s < g.num_slots, "{}: slot {} out of range", where, s);
    for (const Value& v : g.values)
      KILN_CHECK(v.producer >= -1 && v.producer < static_cast<int>(g.nodes.size()),
                 "{}: value '{}' has producer {} out of range", where, v.name, v.producer);
    verify_graph(g);
  } catch (const json::exception& e) {
    KILN_FAIL("{}: malformed graph description: {}", source, e.what());
  } catch (const Error& e) {
    // Errors from dtype parsing or the verifier do not know which file they came from.
    if (std::string(e.what()).find(source) != std::string::npos) throw;
    KILN_FAIL("{}: {}", source, e.what());
  }
  return g;
}

}  // namespace kiln
