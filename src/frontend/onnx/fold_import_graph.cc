#include "frontend/onnx/fold_import_graph.h"

#include "frontend/onnx/interp/op_context.h"
#include "frontend/onnx/interp/run_node.h"
#include "frontend/onnx/supported_ops.h"

namespace kiln {
namespace {

// A graph input's declared shape when every dimension is a number.
bool static_shape(const ImportValue& v, Shape* out) {
  if (!v.shape) return false;
  out->clear();
  for (const OnnxDim& d : *v.shape) {
    if (!d.is_static()) return false;
    out->push_back(d.value);
  }
  return true;
}

}  // namespace

FoldedGraph fold_import_graph(const ImportGraph& graph,
                              const std::map<std::string, Shape>& input_shapes,
                              bool keep_all_data) {
  const std::vector<ImportValue>& values = graph.values();
  FoldedGraph f;
  f.known.resize(values.size());
  f.folded.assign(graph.nodes().size(), false);
  for (size_t v = 0; v < values.size(); ++v) {
    const ImportValue& value = values[v];
    // An initializer of a type the interpreter has not (double, string) stays unknown: the
    // nodes that read it fail when they run, naming it.
    if (value.kind == ImportValueKind::kInitializer && is_interpreter_type(value.type) &&
        value.initializer.data.defined())
      f.known[v] = ImportTensor::from_onnx(value.initializer, value.name);
  }
  for (int v : graph.inputs()) {
    const ImportValue& value = values[v];
    const auto given = input_shapes.find(value.name);
    Shape dims;
    if (given != input_shapes.end())
      f.known[v] = ImportTensor::shape_only(value.type, given->second);
    else if (static_shape(value, &dims))
      f.known[v] = ImportTensor::shape_only(value.type, dims);
  }

  for (int n : graph.order()) {
    const ImportNode& node = graph.nodes()[n];
    if (!is_supported_onnx_op(node)) continue;  // reported by check_supported_ops; outputs unknown
    std::vector<const ImportTensor*> inputs;
    for (int v : node.inputs) inputs.push_back(v < 0 ? nullptr : &f.known[v]);
    std::vector<ImportTensor> outputs;
    try {
      outputs = run_import_node(graph, n, inputs);
    } catch (const ValueNotKnown&) {
      continue;  // outputs stay unknown
    }
    bool constant = !node.outputs.empty();
    for (size_t i = 0; i < outputs.size(); ++i) {
      if (node.outputs[i] < 0) continue;
      constant = constant && outputs[i].has_data();
      f.known[node.outputs[i]] = std::move(outputs[i]);
    }
    if (constant) {
      f.folded[n] = true;
      ++f.folded_nodes;
    }
  }

  // Keep the elements of constants that something at run time reads; the rest keep their shape.
  std::vector<bool> needed(values.size(), false);
  for (int n : graph.order()) {
    if (f.folded[n]) continue;
    f.remaining.push_back(n);
    for (int v : graph.nodes()[n].inputs)
      if (v >= 0) needed[v] = true;
  }
  for (int v : graph.outputs()) needed[v] = true;
  if (keep_all_data) needed.assign(values.size(), true);
  for (size_t v = 0; v < values.size(); ++v)
    if (!needed[v] && f.known[v].has_data())
      f.known[v] = ImportTensor::shape_only(f.known[v].type(), f.known[v].shape());
  return f;
}

}  // namespace kiln
