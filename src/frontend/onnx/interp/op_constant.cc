// Ops that make tensors rather than transform them: Constant, ConstantOfShape, Shape, Range,
// and Identity.
#include <cmath>
#include <cstring>

#include "frontend/onnx/interp/kernel_util.h"
#include "frontend/onnx/interp/kernels.h"

namespace kiln {

// Constant: exactly one of value (a tensor), value_float(s), value_int(s). String and sparse
// constants have no interpreter type.
void run_constant(OpContext& ctx) {
  const ImportNode& node = ctx.node();
  KILN_CHECK(node.attributes.size() == 1,
             "Constant needs exactly one value attribute (value, value_float, value_floats, "
             "value_int, value_ints), got {}",
             node.attributes.size());
  const OnnxAttribute& a = node.attributes[0];
  if (a.name == "value") {
    KILN_CHECK(a.kind == OnnxAttrKind::kTensor && a.tensors.size() == 1,
               "Constant's 'value' must be a tensor");
    ctx.set_output(0, ImportTensor::from_onnx(a.tensors[0], "Constant's value"));
  } else if (a.name == "value_float" && a.kind == OnnxAttrKind::kFloat) {
    ctx.set_output(0, ImportTensor::from_vector(OnnxElemType::kFloat, {}, std::vector<float>{a.f}));
  } else if (a.name == "value_floats" && a.kind == OnnxAttrKind::kFloats) {
    ctx.set_output(0, ImportTensor::from_vector(OnnxElemType::kFloat,
                                                {static_cast<int64_t>(a.floats.size())}, a.floats));
  } else if (a.name == "value_int" && a.kind == OnnxAttrKind::kInt) {
    ctx.set_output(0,
                   ImportTensor::from_vector(OnnxElemType::kInt64, {}, std::vector<int64_t>{a.i}));
  } else if (a.name == "value_ints" && a.kind == OnnxAttrKind::kInts) {
    ctx.set_output(0, ImportTensor::from_vector(OnnxElemType::kInt64,
                                                {static_cast<int64_t>(a.ints.size())}, a.ints));
  } else {
    KILN_FAIL(
        "Constant's attribute '{}' ({}) is not supported: kiln's interpreter takes value, "
        "value_float(s) and value_int(s)",
        a.name, onnx_attr_kind_name(a.kind));
  }
}

// ConstantOfShape(shape): a tensor of that shape filled with the 'value' attribute (a
// one-element tensor; float 0 when absent).
void run_constant_of_shape(OpContext& ctx) {
  const std::vector<int64_t> dims = ctx.input_ints(0, "shape");
  for (int64_t d : dims) KILN_CHECK(d >= 0, "shape {} has a negative dimension", shape_str(dims));
  const OnnxAttribute* value = ctx.attr("value", OnnxAttrKind::kTensor);
  ImportTensor fill = ImportTensor::from_vector(OnnxElemType::kFloat, {1}, std::vector<float>{0});
  if (value != nullptr) {
    KILN_CHECK(value->tensors.size() == 1 && value->tensors[0].dims.size() <= 1 &&
                   shape_numel(value->tensors[0].dims) == 1,
               "ConstantOfShape's 'value' must be a one-element tensor");
    fill = ImportTensor::from_onnx(value->tensors[0], "ConstantOfShape's value");
  }
  ImportTensor& y = ctx.set_output(0, fill.type(), dims);
  const size_t bytes = y.element_bytes();
  auto* dst = static_cast<char*>(y.mutable_raw());
  const int64_t n = y.numel();
  for (int64_t i = 0; i < n; ++i) std::memcpy(dst + i * bytes, fill.raw(), bytes);
}

// Shape(x): x's dimensions as int64; opset 15 adds start/end (clamped like Slice's).
void run_shape(OpContext& ctx) {
  const Shape& shape = ctx.input_shape(0);
  const auto rank = static_cast<int64_t>(shape.size());
  int64_t start = ctx.opset() >= 15 ? ctx.attr_int("start", 0) : 0;
  int64_t end = ctx.opset() >= 15 ? ctx.attr_int("end", rank) : rank;
  if (start < 0) start += rank;
  if (end < 0) end += rank;
  start = std::clamp<int64_t>(start, 0, rank);
  end = std::clamp<int64_t>(end, 0, rank);
  std::vector<int64_t> dims;
  for (int64_t d = start; d < end; ++d) dims.push_back(shape[d]);
  const auto n = static_cast<int64_t>(dims.size());
  ctx.set_output(0, ImportTensor::from_vector(OnnxElemType::kInt64, {n}, dims));
}

// Range(start, limit, delta): max(ceil((limit - start) / delta), 0) values, each the previous
// plus delta (onnxruntime's and ONNX's function body's accumulation).
void run_range(OpContext& ctx) {
  const OnnxElemType type = ctx.input_type(0);
  for (int i = 1; i < 3; ++i)
    KILN_CHECK(ctx.input_type(i) == type, "Range needs start, limit and delta of one type");
  const ImportTensor &start = ctx.input(0), &limit = ctx.input(1), &delta = ctx.input(2);
  for (const ImportTensor* t : {&start, &limit, &delta})
    KILN_CHECK(t->numel() == 1 && t->rank() <= 1, "Range's inputs must be scalars, got {}",
               t->describe());
  visit_numeric(type, "Range", [&](auto tag) {
    using T = decltype(tag);
    const T s = start.data<T>()[0], l = limit.data<T>()[0], d = delta.data<T>()[0];
    KILN_CHECK(d != T{0}, "Range's delta is 0");
    const double count =
        std::ceil((static_cast<double>(l) - static_cast<double>(s)) / static_cast<double>(d));
    KILN_CHECK(!(count > static_cast<double>(ImportTensor::kMaxBytes)),
               "Range({}, {}, {}) has too many elements", static_cast<double>(s),
               static_cast<double>(l), static_cast<double>(d));
    const int64_t n = count > 0 ? static_cast<int64_t>(count) : 0;
    ImportTensor& y = ctx.set_output(0, type, {n});
    T* out = y.mutable_data<T>();
    T v = s;
    for (int64_t i = 0; i < n; ++i) {
      out[i] = v;
      v = wrap_add(v, d);
    }
  });
}

void run_identity(OpContext& ctx) {
  if (ctx.shape_only())
    ctx.set_output(0, ctx.input_type(0), ctx.input_shape(0));
  else
    ctx.set_output(0, ctx.input(0));
}

}  // namespace kiln
