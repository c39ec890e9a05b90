#include "frontend/onnx/interp/op_context.h"

namespace kiln {

OpContext::OpContext(const ImportNode& node, int64_t opset, std::vector<const ImportTensor*> inputs)
    : node_(node), opset_(opset), inputs_(std::move(inputs)), outputs_(node.outputs.size()) {
  for (const ImportTensor* t : inputs_)
    if (t != nullptr && !t->has_data()) shape_only_ = true;
}

bool OpContext::has_input(int i) const {
  return i >= 0 && i < input_count() && inputs_[i] != nullptr;
}

const ImportTensor& OpContext::present(int i) const {
  KILN_CHECK(
      has_input(i), "input {} is required{}", i,
      i < input_count() ? " (it is omitted)" : fmt::format(" (the node has {})", input_count()));
  return *inputs_[i];
}

OnnxElemType OpContext::input_type(int i) const {
  const ImportTensor& t = present(i);
  if (!t.has_shape()) throw ValueNotKnown{};
  return t.type();
}

const Shape& OpContext::input_shape(int i) const {
  const ImportTensor& t = present(i);
  if (!t.has_shape()) throw ValueNotKnown{};
  return t.shape();
}

const ImportTensor& OpContext::input(int i) const {
  const ImportTensor& t = present(i);
  if (!t.has_data()) throw ValueNotKnown{};
  return t;
}

std::vector<int64_t> OpContext::input_ints(int i, std::string_view what) const {
  const ImportTensor& t = input(i);
  KILN_CHECK(t.rank() <= 1 && !is_float_type(t.type()),
             "{} (input {}) must be a 1-d integer tensor, got {}", what, i, t.describe());
  return t.to_int64s();
}

const OnnxAttribute* OpContext::attr(std::string_view name, OnnxAttrKind kind) const {
  const OnnxAttribute* a = node_.find_attribute(name);
  if (a == nullptr) return nullptr;
  KILN_CHECK(a->kind == kind, "attribute '{}' is {}, expected {}", name,
             onnx_attr_kind_name(a->kind), onnx_attr_kind_name(kind));
  return a;
}

int64_t OpContext::attr_int(std::string_view name, int64_t fallback) const {
  const OnnxAttribute* a = attr(name, OnnxAttrKind::kInt);
  return a == nullptr ? fallback : a->i;
}

float OpContext::attr_float(std::string_view name, float fallback) const {
  const OnnxAttribute* a = attr(name, OnnxAttrKind::kFloat);
  return a == nullptr ? fallback : a->f;
}

std::vector<int64_t> OpContext::attr_ints(std::string_view name) const {
  const OnnxAttribute* a = attr(name, OnnxAttrKind::kInts);
  return a == nullptr ? std::vector<int64_t>{} : a->ints;
}

ImportTensor& OpContext::set_output(int i, OnnxElemType type, Shape shape) {
  KILN_CHECK(i < output_count(), "output {} is required (the node has {})", i, output_count());
  outputs_[i] = shape_only_ ? ImportTensor::shape_only(type, std::move(shape))
                            : ImportTensor::zeros(type, std::move(shape));
  return outputs_[i];
}

void OpContext::set_output(int i, ImportTensor tensor) {
  KILN_CHECK(i < output_count(), "output {} is required (the node has {})", i, output_count());
  outputs_[i] = std::move(tensor);
}

int normalize_axis(int64_t axis, int rank, std::string_view what) {
  KILN_CHECK(axis >= -rank && axis < rank, "{} {} is out of range for rank {} (valid: {}..{})",
             what, axis, rank, -rank, rank - 1);
  return static_cast<int>(axis < 0 ? axis + rank : axis);
}

}  // namespace kiln
