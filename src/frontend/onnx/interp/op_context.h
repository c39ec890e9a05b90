// What a kernel of the import graph's interpreter sees of its node: inputs, attributes, the
// opset, and where its outputs go. The same kernel serves two purposes:
// - running the node on known inputs (execution, and constant folding at build time);
// - shape inference at build time, where an input may be known by its shape alone. A kernel
//   declares its outputs' types and shapes first (set_output), then returns when shape_only()
//   says that some input has no elements. Asking for what is not known (input() of a shape-only
//   input, input_shape() of an input of unknown shape) throws ValueNotKnown: the outputs are then
//   unknown too. Shape reads only its input's shape, so Shape of a shape-only value folds.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "frontend/onnx/import_graph.h"
#include "frontend/onnx/import_tensor.h"

namespace kiln {

// Not an error: inference needed a value that is not known before the graph runs.
struct ValueNotKnown {};

class OpContext {
 public:
  // `inputs`: one per node input, null for an omitted optional one.
  OpContext(const ImportNode& node, int64_t opset, std::vector<const ImportTensor*> inputs);

  const ImportNode& node() const { return node_; }
  int64_t opset() const { return opset_; }

  int input_count() const { return static_cast<int>(inputs_.size()); }
  // Present (neither omitted nor past the end of the node's inputs).
  bool has_input(int i) const;
  OnnxElemType input_type(int i) const;
  const Shape& input_shape(int i) const;
  int input_rank(int i) const { return static_cast<int>(input_shape(i).size()); }
  // The input's elements.
  const ImportTensor& input(int i) const;
  // An input that must be a 1-d (or 0-d) integer tensor, as int64 values ("axes", "shape").
  std::vector<int64_t> input_ints(int i, std::string_view what) const;

  // Attributes; `fallback` when absent; an attribute of the wrong kind is an error.
  bool has_attr(std::string_view name) const { return node_.find_attribute(name) != nullptr; }
  int64_t attr_int(std::string_view name, int64_t fallback) const;
  float attr_float(std::string_view name, float fallback) const;
  // Empty when absent.
  std::vector<int64_t> attr_ints(std::string_view name) const;
  // The attribute when present, checked to be of `kind`; null when absent.
  const OnnxAttribute* attr(std::string_view name, OnnxAttrKind kind) const;

  int output_count() const { return static_cast<int>(node_.outputs.size()); }
  // Declares output i. The returned tensor's elements (zero-filled) are the kernel's to write,
  // unless shape_only(): then it has a shape and no elements.
  ImportTensor& set_output(int i, OnnxElemType type, Shape shape);
  // An output computed or viewed elsewhere (Reshape's view of its input, Shape's dims).
  void set_output(int i, ImportTensor tensor);
  // True when some present input has no elements: the kernel returns after set_output.
  bool shape_only() const { return shape_only_; }

  std::vector<ImportTensor>& outputs() { return outputs_; }

 private:
  const ImportTensor& present(int i) const;

  const ImportNode& node_;
  int64_t opset_;
  std::vector<const ImportTensor*> inputs_;
  std::vector<ImportTensor> outputs_;
  bool shape_only_ = false;
};

// An axis in [-rank, rank) as an index in [0, rank); `what` names it in the error.
int normalize_axis(int64_t axis, int rank, std::string_view what);

}  // namespace kiln
