#include "frontend/onnx/run_import_graph.h"

#include "frontend/onnx/fold_import_graph.h"
#include "frontend/onnx/interp/op_context.h"
#include "frontend/onnx/interp/run_node.h"
#include "frontend/onnx/supported_ops.h"

namespace kiln {
namespace {

std::string declared(const ImportValue& v) {
  return onnx_elem_type_name(v.type) + (v.shape ? onnx_shape_str(*v.shape) : "[any rank]");
}

std::string input_list(const ImportGraph& graph) {
  std::vector<std::string> list;
  for (int v : graph.inputs())
    list.push_back(fmt::format("'{}' ({})", graph.values()[v].name, declared(graph.values()[v])));
  return fmt::format("{}", fmt::join(list, ", "));
}

// Why a node could not read input `v` at run time.
std::string unavailable(const ImportGraph& graph, int v) {
  const ImportValue& value = graph.values()[v];
  if (value.kind == ImportValueKind::kInitializer && !is_interpreter_type(value.type))
    return fmt::format(
        "initializer '{}' is {}, a type kiln's ONNX interpreter does not compute "
        "with",
        value.name, onnx_elem_type_name(value.type));
  return fmt::format("'{}' has no value", value.name);
}

}  // namespace

void check_import_inputs(const ImportGraph& graph,
                         const std::map<std::string, ImportTensor>& inputs) {
  const std::string& path = graph.path();
  for (const auto& [name, tensor] : inputs) {
    const int v = graph.find_value(name);
    const bool is_input = v >= 0 && graph.values()[v].kind == ImportValueKind::kInput;
    KILN_CHECK_USAGE(is_input, "{}: '{}' is not an input of the graph{}; its inputs are {}", path,
                     name,
                     v >= 0 && graph.values()[v].kind == ImportValueKind::kInitializer
                         ? " (it is an initializer)"
                         : "",
                     input_list(graph));
  }
  // symbolic dimension name -> (size, the input that gave it)
  std::map<std::string, std::pair<int64_t, std::string>> symbols;
  for (int v : graph.inputs()) {
    const ImportValue& value = graph.values()[v];
    const auto it = inputs.find(value.name);
    KILN_CHECK_USAGE(it != inputs.end(),
                     "{}: input '{}' ({}) is missing; the graph's inputs are {}", path, value.name,
                     declared(value), input_list(graph));
    const ImportTensor& t = it->second;
    KILN_CHECK_USAGE(t.type() == value.type, "{}: input '{}' is {}, expected {}", path, value.name,
                     t.describe(), declared(value));
    check_interpreter_type(t.type(), fmt::format("{}: input '{}'", path, value.name));
    if (!value.shape) continue;
    const std::vector<OnnxDim>& dims = *value.shape;
    KILN_CHECK_USAGE(t.rank() == static_cast<int>(dims.size()),
                     "{}: input '{}' is {} (rank {}), expected {} (rank {})", path, value.name,
                     t.describe(), t.rank(), declared(value), dims.size());
    for (size_t d = 0; d < dims.size(); ++d) {
      const int64_t got = t.dim(static_cast<int>(d));
      if (dims[d].is_static()) {
        KILN_CHECK_USAGE(got == dims[d].value,
                         "{}: input '{}' is {}, expected {}: dimension {} "
                         "must be {}",
                         path, value.name, t.describe(), declared(value), d, dims[d].value);
      } else if (!dims[d].param.empty()) {
        const auto [at, first] = symbols.emplace(dims[d].param, std::make_pair(got, value.name));
        KILN_CHECK_USAGE(first || at->second.first == got,
                         "{}: input '{}' is {}: its dimension {} ('{}') is {}, but input '{}' "
                         "gave '{}' = {}",
                         path, value.name, t.describe(), d, dims[d].param, got, at->second.second,
                         dims[d].param, at->second.first);
      }
    }
  }
}

std::map<std::string, ImportTensor> run_import_graph(
    const ImportGraph& graph, const std::map<std::string, ImportTensor>& inputs,
    ImportRunStats* stats) {
  check_supported_ops(graph);
  check_import_inputs(graph, inputs);
  std::map<std::string, Shape> shapes;
  for (const auto& [name, t] : inputs) shapes[name] = t.shape();
  FoldedGraph folded = fold_import_graph(graph, shapes);
  std::vector<ImportTensor>& values = folded.known;
  for (const auto& [name, t] : inputs) values[graph.find_value(name)] = t;

  // The last node to read each value; graph outputs are never freed.
  const int count = static_cast<int>(graph.values().size());
  std::vector<int> last_reader(count, -1);
  for (int n : folded.remaining)
    for (int v : graph.nodes()[n].inputs)
      if (v >= 0) last_reader[v] = n;
  for (int v : graph.outputs()) last_reader[v] = -2;

  for (int n : folded.remaining) {
    const ImportNode& node = graph.nodes()[n];
    std::vector<const ImportTensor*> args;
    for (int v : node.inputs) args.push_back(v < 0 ? nullptr : &values[v]);
    std::vector<ImportTensor> outputs;
    try {
      outputs = run_import_node(graph, n, args);
    } catch (const ValueNotKnown&) {
      int missing = -1;
      for (int v : node.inputs)
        if (v >= 0 && !values[v].has_data()) missing = missing < 0 ? v : missing;
      KILN_FAIL("{}: node '{}' ({}) cannot run: {}", graph.path(), node.name, node.op_type,
                missing < 0 ? std::string("an input has no value") : unavailable(graph, missing));
    }
    for (size_t i = 0; i < outputs.size(); ++i) {
      const int v = node.outputs[i];
      if (v < 0) continue;
      // Shape inference and the run use the same kernels: a difference is kiln's bug.
      const ImportTensor& inferred = values[v];
      KILN_CHECK(!inferred.has_shape() || (inferred.shape() == outputs[i].shape() &&
                                           inferred.type() == outputs[i].type()),
                 "{}: node '{}' ({}) gave {} for '{}', shape inference {}", graph.path(), node.name,
                 node.op_type, outputs[i].describe(), graph.values()[v].name, inferred.describe());
      values[v] = std::move(outputs[i]);
    }
    for (int v : node.inputs)
      if (v >= 0 && last_reader[v] == n) values[v] = ImportTensor();
  }
  if (stats != nullptr) {
    stats->folded_nodes = folded.folded_nodes;
    stats->executed_nodes = static_cast<int>(folded.remaining.size());
  }

  std::map<std::string, ImportTensor> result;
  for (int v : graph.outputs()) {
    const ImportValue& value = graph.values()[v];
    const ImportTensor& t = values[v];
    KILN_CHECK(t.has_data(), "{}: graph output '{}' has no value", graph.path(), value.name);
    KILN_CHECK(value.type == OnnxElemType::kUndefined || value.type == t.type(),
               "{}: graph output '{}' is declared {}, the graph computed {}", graph.path(),
               value.name, declared(value), t.describe());
    result[value.name] = t;
  }
  return result;
}

}  // namespace kiln
