// The import graph's tensors: ONNX's element type (bool included, which kiln's DType has not)
// over kiln's storage. A tensor is in one of three states: unknown (nothing is known, not even
// the rank), shape-only (type and shape, no elements: what build-time shape inference knows of a
// value that depends on input data), or full. Tensors are immutable once a node produced them:
// views (Reshape, Identity, initializers mapped from the file) share storage.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/onnx/onnx_model.h"

namespace kiln {

// The element types the interpreter computes with. float16 and bfloat16 are held as their bits
// (uint16_t) and computed in float; bool and uint8 as uint8_t.
bool is_interpreter_type(OnnxElemType type);
// Refuses a type the interpreter has no tensors of, naming `what` ("input 'x'").
void check_interpreter_type(OnnxElemType type, const std::string& what);
bool is_float_type(OnnxElemType type);  // float, float16, bfloat16
bool is_half_type(OnnxElemType type);   // float16, bfloat16

class ImportTensor {
 public:
  ImportTensor() = default;  // unknown
  // A zero-filled tensor. Refuses shapes with negative or overflowing dimensions and tensors
  // beyond kMaxBytes (a shape computed from bad data must fail with a message, not exhaust
  // memory).
  static ImportTensor zeros(OnnxElemType type, Shape shape);
  static ImportTensor shape_only(OnnxElemType type, Shape shape);
  // A view of an initializer or Constant attribute's data (no copy).
  static ImportTensor from_onnx(const OnnxTensor& tensor, const std::string& what);
  // A view of a kiln tensor (a safetensors input) with `type`'s bytes.
  static ImportTensor from_tensor(OnnxElemType type, const Tensor& tensor);
  template <typename T>
  static ImportTensor from_vector(OnnxElemType type, Shape shape, const std::vector<T>& values) {
    ImportTensor t = zeros(type, std::move(shape));
    KILN_CHECK(static_cast<size_t>(t.numel()) == values.size(), "{} values for a tensor of {}",
               values.size(), shape_str(t.shape()));
    std::copy(values.begin(), values.end(), t.mutable_data<T>());
    return t;
  }

  static constexpr int64_t kMaxBytes = int64_t{64} << 30;

  bool has_shape() const { return type_ != OnnxElemType::kUndefined; }
  bool has_data() const { return data_.defined(); }
  OnnxElemType type() const { return type_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_.at(i); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t element_bytes() const { return onnx_elem_type_bytes(type_); }

  // Typed access: T must be the type's storage type (float, uint16_t for float16/bfloat16,
  // int64_t, int32_t, int8_t, uint8_t for uint8 and bool).
  template <typename T>
  const T* data() const {
    check_access(sizeof(T), storage_kind<T>());
    return static_cast<const T*>(data_.raw());
  }
  template <typename T>
  T* mutable_data() {
    check_access(sizeof(T), storage_kind<T>());
    return static_cast<T*>(data_.raw());
  }
  const void* raw() const { return data_.raw(); }
  void* mutable_raw() { return data_.raw(); }

  // Same elements, another shape of the same size (a view).
  ImportTensor reshaped(Shape shape) const;
  // The elements of an integer tensor (int64, int32, int8, uint8, bool) as int64 values.
  std::vector<int64_t> to_int64s() const;
  // Every element as float (any numeric type; bool as 0/1).
  std::vector<float> to_floats() const;
  // A float copy of a float16/bfloat16 tensor; a float tensor itself.
  ImportTensor widened() const;
  // A float tensor narrowed to `half` (float16 or bfloat16), rounding to nearest even.
  ImportTensor narrowed(OnnxElemType half) const;
  // The kiln tensor to write to safetensors: same bytes; bool and uint8 as i8.
  Tensor to_kiln() const;
  // "float[2, 3]"
  std::string describe() const;

 private:
  enum class StorageKind { kFloat, kBits16, kInt64, kInt32, kInt8, kUint8 };
  template <typename T>
  static constexpr StorageKind storage_kind() {
    if constexpr (std::is_same_v<T, float>) return StorageKind::kFloat;
    if constexpr (std::is_same_v<T, uint16_t>) return StorageKind::kBits16;
    if constexpr (std::is_same_v<T, int64_t>) return StorageKind::kInt64;
    if constexpr (std::is_same_v<T, int32_t>) return StorageKind::kInt32;
    if constexpr (std::is_same_v<T, int8_t>) return StorageKind::kInt8;
    if constexpr (std::is_same_v<T, uint8_t>) return StorageKind::kUint8;
  }
  void check_access(size_t bytes, StorageKind kind) const;

  OnnxElemType type_ = OnnxElemType::kUndefined;
  Shape shape_;
  Tensor data_;
};

// Reads a scalar (a 0-d or one-element tensor) of an integer type as int64.
int64_t scalar_int64(const ImportTensor& t, const std::string& what);

}  // namespace kiln
