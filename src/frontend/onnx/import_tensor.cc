#include "frontend/onnx/import_tensor.h"

#include <algorithm>
#include <cstring>

#include "core/half.h"

namespace kiln {

bool is_interpreter_type(OnnxElemType type) {
  switch (type) {
    case OnnxElemType::kFloat:
    case OnnxElemType::kFloat16:
    case OnnxElemType::kBFloat16:
    case OnnxElemType::kInt64:
    case OnnxElemType::kInt32:
    case OnnxElemType::kInt8:
    case OnnxElemType::kUint8:
    case OnnxElemType::kBool:
      return true;
    case OnnxElemType::kUndefined:
    case OnnxElemType::kUint16:
    case OnnxElemType::kInt16:
    case OnnxElemType::kString:
    case OnnxElemType::kDouble:
    case OnnxElemType::kUint32:
    case OnnxElemType::kUint64:
    case OnnxElemType::kComplex64:
    case OnnxElemType::kComplex128:
      return false;
  }
  return false;
}

void check_interpreter_type(OnnxElemType type, const std::string& what) {
  KILN_CHECK(is_interpreter_type(type),
             "{} is {}: kiln's ONNX interpreter computes with float, float16, bfloat16, int64, "
             "int32, int8, uint8 and bool tensors",
             what, onnx_elem_type_name(type));
}

bool is_float_type(OnnxElemType type) { return type == OnnxElemType::kFloat || is_half_type(type); }
bool is_half_type(OnnxElemType type) {
  return type == OnnxElemType::kFloat16 || type == OnnxElemType::kBFloat16;
}

namespace {

DType storage_dtype(OnnxElemType type) {
  DType d = DType::kF32;
  KILN_CHECK(onnx_elem_type_to_dtype(type, &d), "no storage for ONNX type {}",
             onnx_elem_type_name(type));
  return d;
}

}  // namespace

ImportTensor ImportTensor::zeros(OnnxElemType type, Shape shape) {
  check_interpreter_type(type, "a tensor");
  const int64_t n = shape_numel(shape);  // rejects negative and overflowing dimensions
  int64_t bytes = 0;
  KILN_CHECK(!__builtin_mul_overflow(n, static_cast<int64_t>(onnx_elem_type_bytes(type)), &bytes) &&
                 bytes <= kMaxBytes,
             "a {} tensor of shape {} would take more than {} GiB", onnx_elem_type_name(type),
             shape_str(shape), kMaxBytes >> 30);
  ImportTensor t;
  t.type_ = type;
  t.data_ = Tensor::empty(storage_dtype(type), shape);
  t.shape_ = std::move(shape);
  return t;
}

ImportTensor ImportTensor::shape_only(OnnxElemType type, Shape shape) {
  shape_numel(shape);
  ImportTensor t;
  t.type_ = type;
  t.shape_ = std::move(shape);
  return t;
}

ImportTensor ImportTensor::from_onnx(const OnnxTensor& tensor, const std::string& what) {
  check_interpreter_type(tensor.type, what);
  KILN_CHECK(tensor.data.defined(), "{} has no data", what);
  ImportTensor t;
  t.type_ = tensor.type;
  t.shape_ = tensor.dims;
  t.data_ = tensor.data;
  return t;
}

ImportTensor ImportTensor::from_tensor(OnnxElemType type, const Tensor& tensor) {
  check_interpreter_type(type, "a tensor");
  KILN_CHECK(tensor.is_contiguous() && storage_dtype(type) == tensor.dtype(),
             "a {} tensor cannot hold ONNX {} elements", dtype_name(tensor.dtype()),
             onnx_elem_type_name(type));
  ImportTensor t;
  t.type_ = type;
  t.shape_ = tensor.shape();
  t.data_ = tensor;
  return t;
}

void ImportTensor::check_access(size_t bytes, StorageKind kind) const {
  KILN_CHECK(has_data(), "the elements of a {} tensor {} are not known here",
             onnx_elem_type_name(type_), shape_str(shape_));
  bool ok = false;
  switch (type_) {
    case OnnxElemType::kFloat:
      ok = kind == StorageKind::kFloat;
      break;
    case OnnxElemType::kFloat16:
    case OnnxElemType::kBFloat16:
      ok = kind == StorageKind::kBits16;
      break;
    case OnnxElemType::kInt64:
      ok = kind == StorageKind::kInt64;
      break;
    case OnnxElemType::kInt32:
      ok = kind == StorageKind::kInt32;
      break;
    case OnnxElemType::kInt8:
      ok = kind == StorageKind::kInt8;
      break;
    case OnnxElemType::kUint8:
    case OnnxElemType::kBool:
      ok = kind == StorageKind::kUint8;
      break;
    case OnnxElemType::kUndefined:
    case OnnxElemType::kUint16:
    case OnnxElemType::kInt16:
    case OnnxElemType::kString:
    case OnnxElemType::kDouble:
    case OnnxElemType::kUint32:
    case OnnxElemType::kUint64:
    case OnnxElemType::kComplex64:
    case OnnxElemType::kComplex128:
      break;
  }
  KILN_CHECK(ok && bytes == element_bytes(), "a {} tensor read as {}-byte elements of another type",
             onnx_elem_type_name(type_), bytes);
}

ImportTensor ImportTensor::reshaped(Shape shape) const {
  KILN_CHECK(shape_numel(shape) == numel(), "cannot view {} elements of {} as {}", numel(),
             shape_str(shape_), shape_str(shape));
  ImportTensor t = *this;
  if (has_data()) t.data_ = data_.reshape(shape);
  t.shape_ = std::move(shape);
  return t;
}

std::vector<int64_t> ImportTensor::to_int64s() const {
  const size_t n = static_cast<size_t>(numel());
  std::vector<int64_t> v(n);
  if (type_ == OnnxElemType::kInt64)
    std::copy_n(data<int64_t>(), n, v.begin());
  else if (type_ == OnnxElemType::kInt32)
    std::copy_n(data<int32_t>(), n, v.begin());
  else if (type_ == OnnxElemType::kInt8)
    std::copy_n(data<int8_t>(), n, v.begin());
  else if (type_ == OnnxElemType::kUint8)
    std::copy_n(data<uint8_t>(), n, v.begin());
  else if (type_ == OnnxElemType::kBool)
    std::transform(data<uint8_t>(), data<uint8_t>() + n, v.begin(),
                   [](uint8_t b) -> int64_t { return b != 0; });
  else
    KILN_FAIL("expected an integer tensor, got {}", describe());
  return v;
}

std::vector<float> ImportTensor::to_floats() const {
  const size_t n = static_cast<size_t>(numel());
  std::vector<float> v(n);
  if (type_ == OnnxElemType::kFloat) {
    std::copy_n(data<float>(), n, v.begin());
  } else if (type_ == OnnxElemType::kFloat16) {
    std::transform(data<uint16_t>(), data<uint16_t>() + n, v.begin(), fp16_to_float);
  } else if (type_ == OnnxElemType::kBFloat16) {
    std::transform(data<uint16_t>(), data<uint16_t>() + n, v.begin(), bf16_to_float);
  } else {
    const std::vector<int64_t> ints = to_int64s();
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(ints[i]);
  }
  return v;
}

ImportTensor ImportTensor::widened() const {
  if (type_ == OnnxElemType::kFloat) return *this;
  KILN_CHECK(is_half_type(type_), "widened: {} is not a half-precision tensor", describe());
  ImportTensor out = zeros(OnnxElemType::kFloat, shape_);
  const std::vector<float> v = to_floats();
  std::copy(v.begin(), v.end(), out.mutable_data<float>());
  return out;
}

ImportTensor ImportTensor::narrowed(OnnxElemType half) const {
  KILN_CHECK(is_half_type(half) && type_ == OnnxElemType::kFloat, "narrowed: {} to {}", describe(),
             onnx_elem_type_name(half));
  ImportTensor out = zeros(half, shape_);
  const float* src = data<float>();
  uint16_t* dst = out.mutable_data<uint16_t>();
  const int64_t n = numel();
  for (int64_t i = 0; i < n; ++i)
    dst[i] = half == OnnxElemType::kFloat16 ? float_to_fp16(src[i]) : float_to_bf16(src[i]);
  return out;
}

Tensor ImportTensor::to_kiln() const {
  KILN_CHECK(has_data(), "{} has no elements to write", describe());
  return data_;
}

std::string ImportTensor::describe() const {
  if (!has_shape()) return "a tensor of unknown shape";
  return onnx_elem_type_name(type_) + shape_str(shape_);
}

int64_t scalar_int64(const ImportTensor& t, const std::string& what) {
  KILN_CHECK(t.numel() == 1 && t.rank() <= 1, "{} must be a scalar, got {}", what, t.describe());
  KILN_CHECK(!is_float_type(t.type()), "{} must be an integer, got {}", what, t.describe());
  return t.to_int64s()[0];
}

}  // namespace kiln
