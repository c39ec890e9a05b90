// The ONNX import graph: a frontend-local graph of ONNX's own ops (generic n-d broadcasting,
// integer shape arithmetic, symbolic dims) built from an OnnxModel. It is what the ONNX frontend
// works on before lifting into kiln's IR (graph/): values by index, each with its producer,
// initializer data as kiln tensors, and the nodes in a topological order. kiln's IR does not grow
// ONNX's op set; this graph holds it instead.
#pragma once

#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "io/onnx/onnx_model.h"

namespace kiln {

enum class ImportValueKind {
  kInput,         // a graph input the caller feeds
  kInitializer,   // constant data from the file (may also be listed as an overridable input)
  kIntermediate,  // produced by a node
};

struct ImportValue {
  std::string name;
  ImportValueKind kind = ImportValueKind::kIntermediate;
  OnnxElemType type = OnnxElemType::kUndefined;
  std::optional<std::vector<OnnxDim>> shape;  // absent: unknown rank
  int producer = -1;                          // node index, -1 for inputs and initializers
  bool is_output = false;
  // kInitializer: the file's tensor (data undefined for types kiln has no dtype for).
  OnnxTensor initializer;
};

struct ImportNode {
  std::string name;
  std::string op_type;
  std::string domain;  // "" for the default domain
  // Value indices; -1 for an omitted optional input or output.
  std::vector<int> inputs;
  std::vector<int> outputs;
  std::vector<OnnxAttribute> attributes;
  const OnnxAttribute* find_attribute(std::string_view name) const;
  // "MatMul" for the default domain, "com.microsoft::Attention" otherwise.
  std::string qualified_op() const;
};

class ImportGraph {
 public:
  // Builds the graph of `model`'s main graph: every node input is a graph input, an initializer
  // or another node's output; no value has two producers; the nodes have an order in which each
  // runs after what it reads (a cycle is an error naming the nodes on it). Throws kiln::Error
  // naming the file and the node or value at fault.
  static ImportGraph build(const OnnxModel& model);

  const std::string& path() const { return path_; }
  int64_t opset() const { return opset_; }
  const std::vector<ImportValue>& values() const { return values_; }
  const std::vector<ImportNode>& nodes() const { return nodes_; }
  const std::vector<int>& inputs() const { return inputs_; }    // runtime inputs only
  const std::vector<int>& outputs() const { return outputs_; }  // graph outputs, in file order
  // Node indices, producers before consumers (stable: file order where the file is ordered).
  const std::vector<int>& order() const { return order_; }
  // -1 when there is no value of that name.
  int find_value(const std::string& name) const;

 private:
  // An inference-mode Dropout (training_mode absent or a constant false, its mask unread: what
  // torch's dynamo exporter writes for each nn.Dropout of an eval() model) is the identity: it
  // becomes an Identity node, which lifting walks through like the exporters' own. A Dropout in
  // training mode, or whose mask is read, stays a Dropout (an op kiln does not import).
  void drop_inference_dropouts();

  std::string path_;
  int64_t opset_ = 0;
  std::vector<ImportValue> values_;
  std::vector<ImportNode> nodes_;
  std::vector<int> inputs_, outputs_, order_;
  std::unordered_map<std::string, int> by_name_;
};

}  // namespace kiln
