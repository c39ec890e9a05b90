#include "graph/builder.h"

#include "graph/op_registry.h"
#include "graph/verifier.h"

namespace kiln {

int GraphBuilder::input(const std::string& name, DType dtype, SymShape shape) {
  KILN_CHECK(graph_.find_value(name) < 0, "graph '{}': duplicate value name '{}'", graph_.name,
             name);
  Value v;
  v.name = name;
  v.dtype = dtype;
  v.shape = std::move(shape);
  v.kind = ValueKind::kInput;
  graph_.values.push_back(std::move(v));
  const int id = static_cast<int>(graph_.values.size()) - 1;
  graph_.inputs.push_back(id);
  return id;
}

int GraphBuilder::weight(const std::string& name, Tensor data) {
  KILN_CHECK(graph_.find_value(name) < 0, "graph '{}': duplicate value name '{}'", graph_.name,
             name);
  return graph_.add_weight(name, std::move(data));
}

void GraphBuilder::output(int value, const std::string& name) {
  KILN_CHECK(value >= 0 && value < static_cast<int>(graph_.values.size()),
             "graph '{}': output '{}' refers to no value", graph_.name, name);
  KILN_CHECK(graph_.find_value(name) < 0 || graph_.find_value(name) == value,
             "graph '{}': output name '{}' is taken", graph_.name, name);
  graph_.values[value].name = name;
  graph_.outputs.push_back(value);
}

int GraphBuilder::add_node(OpKind op, std::vector<int> inputs, OpAttrs attrs,
                           const std::string& name) {
  Node node;
  node.op = op;
  node.name = name;
  node.inputs = std::move(inputs);
  node.attrs = std::move(attrs);
  // Trailing absent optional inputs are dropped so that arity reflects what is present.
  while (!node.inputs.empty() && node.inputs.back() < 0) node.inputs.pop_back();
  const std::vector<ValueType> types = infer_node(graph_, node);
  const int node_id = static_cast<int>(graph_.nodes.size());
  for (size_t i = 0; i < types.size(); ++i) {
    Value v;
    v.name = types.size() == 1 ? name : name + "." + std::to_string(i);
    v.dtype = types[i].dtype;
    v.shape = types[i].shape;
    v.kind = ValueKind::kActivation;
    v.producer = node_id;
    graph_.values.push_back(std::move(v));
    node.outputs.push_back(static_cast<int>(graph_.values.size()) - 1);
  }
  graph_.nodes.push_back(std::move(node));
  return graph_.nodes.back().outputs[0];
}

int GraphBuilder::embedding(int table, int ids, const std::string& name) {
  return add_node(OpKind::kEmbedding, {table, ids}, NoAttrs{}, name);
}
int GraphBuilder::embedding_quantized(int table, int ids, int scales, const std::string& name) {
  return add_node(OpKind::kEmbedding, {table, ids, scales}, NoAttrs{}, name);
}
int GraphBuilder::linear(int x, int w, int bias, const std::string& name) {
  return add_node(OpKind::kLinear, {x, w, bias}, LinearAttrs{}, name);
}
int GraphBuilder::linear_quantized(int x, int w, int bias, int scales, const std::string& name) {
  return add_node(OpKind::kLinear, {x, w, bias, scales}, LinearAttrs{}, name);
}
int GraphBuilder::add(int a, int b, const std::string& name) {
  return add_node(OpKind::kAdd, {a, b}, NoAttrs{}, name);
}
int GraphBuilder::mul(int a, int b, const std::string& name) {
  return add_node(OpKind::kMul, {a, b}, NoAttrs{}, name);
}
int GraphBuilder::scale(int x, float factor, const std::string& name) {
  return add_node(OpKind::kScale, {x}, ScaleAttrs{factor}, name);
}
int GraphBuilder::rms_norm(int x, int w, double eps, const std::string& name) {
  return add_node(OpKind::kRmsNorm, {x, w}, NormAttrs{eps}, name);
}
int GraphBuilder::layer_norm(int x, int w, int b, double eps, const std::string& name) {
  return add_node(OpKind::kLayerNorm, {x, w, b}, NormAttrs{eps}, name);
}
int GraphBuilder::activation(int x, Activation act, const std::string& name) {
  return add_node(OpKind::kActivation, {x}, ActivationAttrs{act}, name);
}
int GraphBuilder::gated_activation(int gate, int up, Activation act, const std::string& name) {
  return add_node(OpKind::kGatedActivation, {gate, up}, ActivationAttrs{act}, name);
}
int GraphBuilder::softmax(int x, const std::string& name) {
  return add_node(OpKind::kSoftmax, {x}, NoAttrs{}, name);
}
int GraphBuilder::weight_f32(const std::string& name, Tensor data) {
  const bool narrow = data.dtype() != DType::kF32;
  const int id = weight(name, std::move(data));
  return narrow ? cast(id, DType::kF32, name + ".f32") : id;
}
int GraphBuilder::cast(int x, DType dtype, const std::string& name) {
  return add_node(OpKind::kCast, {x}, CastAttrs{dtype}, name);
}
int GraphBuilder::attention(int q, int k, int v, int rel_table, const AttentionAttrs& attrs,
                            const std::string& name) {
  std::vector<int> inputs = {q};
  if (k >= 0) inputs.push_back(k);
  if (v >= 0) inputs.push_back(v);
  if (rel_table >= 0) inputs.push_back(rel_table);
  return add_node(OpKind::kAttention, std::move(inputs), attrs, name);
}
int GraphBuilder::gather_rows(int x, int rows, const std::string& name) {
  return add_node(OpKind::kGatherRows, {x, rows}, NoAttrs{}, name);
}

Graph GraphBuilder::finish() {
  verify_graph(graph_);
  return std::move(graph_);
}

}  // namespace kiln
