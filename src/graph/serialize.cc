#include "graph/serialize.h"

#include "graph/op_registry.h"
#include "graph/verifier.h"

namespace kiln {

using nlohmann::json;

namespace {

std::string_view value_kind_name(ValueKind k) {
  switch (k) {
    case ValueKind::kInput:
      return "input";
    case ValueKind::kWeight:
      return "weight";
    case ValueKind::kActivation:
      return "activation";
  }
  return "?";
}

ValueKind parse_value_kind(const std::string& s, const std::string& where) {
  for (ValueKind k : {ValueKind::kInput, ValueKind::kWeight, ValueKind::kActivation})
    if (value_kind_name(k) == s) return k;
  KILN_FAIL("{}: unknown value kind '{}'", where, s);
}

}  // namespace

json graph_to_json(const Graph& g, const std::function<int(const Value&)>& blob_of) {
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
            {"kind", value_kind_name(v.kind)},
            {"producer", v.producer}};
    if (v.kind == ValueKind::kWeight) jv["blob"] = blob_of(v);
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

Graph graph_from_json(const json& j, const std::function<void(int, Value&)>& bind_blob,
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
        // A zero or negative size would pass shape inference and fail much later inside a
        // kernel (a division by zero, a negative allocation); refuse it here.
        KILN_CHECK(v.shape.back().is_symbolic() || v.shape.back().value > 0,
                   "{}: value '{}' has dimension {} (every dimension must be positive)", where,
                   v.name, v.shape.back().value);
      }
      v.kind = parse_value_kind(jv.at("kind").get<std::string>(), where);
      v.producer = jv.at("producer").get<int>();
      if (v.kind == ValueKind::kWeight) {
        bind_blob(jv.at("blob").get<int>(), v);
        KILN_CHECK(v.data.dtype() == v.dtype && v.data.rank() == static_cast<int>(v.shape.size()),
                   "{}: weight '{}' is {} {} but its blob holds {} {}", where, v.name,
                   dtype_name(v.dtype), sym_shape_str(v.shape), dtype_name(v.data.dtype()),
                   shape_str(v.data.shape()));
        for (size_t d = 0; d < v.shape.size(); ++d)
          KILN_CHECK(!v.shape[d].is_symbolic() && v.shape[d].value == v.data.shape()[d],
                     "{}: weight '{}' is {} but its blob holds {}", where, v.name,
                     sym_shape_str(v.shape), shape_str(v.data.shape()));
      }
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
      n.attrs =
          attrs_from_json(jn.at("attrs"), op_schema(n.op).attrs, where + " node '" + n.name + "'");
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
