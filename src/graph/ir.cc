#include "graph/ir.h"

#include <sstream>

#include "io/weight_spill.h"

namespace kiln {
namespace {

// A weight's bytes as a build keeps them: spilled when a WeightSpill is active.
Tensor spill_if_building(Tensor data) {
  WeightSpill* spill = WeightSpill::active();
  return spill != nullptr ? spill->put(std::move(data)) : data;
}

}  // namespace

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

int Graph::add_weight(std::string value_name, Tensor data) {
  Value v;
  v.name = std::move(value_name);
  v.dtype = data.dtype();
  for (int64_t d : data.shape()) v.shape.push_back(Dim::of(d));
  v.kind = ValueKind::kWeight;
  v.data = spill_if_building(std::move(data));
  values.push_back(std::move(v));
  return static_cast<int>(values.size()) - 1;
}

void Graph::set_weight_data(int id, Tensor data) {
  Value& v = values.at(static_cast<size_t>(id));
  v.data.release_pages();
  v.data = spill_if_building(std::move(data));
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

int Graph::input_index(std::string_view value_name) const {
  for (size_t i = 0; i < inputs.size(); ++i)
    if (values[inputs[i]].name == value_name) return static_cast<int>(i);
  KILN_FAIL("graph '{}' has no input named '{}'", name, value_name);
}

int Graph::output_index(std::string_view value_name) const {
  for (size_t i = 0; i < outputs.size(); ++i)
    if (values[outputs[i]].name == value_name) return static_cast<int>(i);
  KILN_FAIL("graph '{}' has no output named '{}'", name, value_name);
}

int64_t Graph::weight_bytes() const {
  int64_t total = 0;
  for (const Value& v : values)
    if (v.kind == ValueKind::kWeight) total += static_cast<int64_t>(v.data.nbytes());
  return total;
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
    const std::string attrs = attrs_summary(n.attrs);
    out << "  " << fmt::format("{:<16}", op_name(n.op)) << fmt::format("{}", fmt::join(outs, ", "))
        << " = " << n.name << "(" << fmt::format("{}", fmt::join(ins, ", ")) << ")" << attrs
        << "\n";
  }
  for (int id : graph.outputs) out << "  output " << describe(id) << "\n";
  return out.str();
}

}  // namespace kiln
