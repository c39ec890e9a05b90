// An ONNX model file as plain C++ values: what the protobuf says, checked for consistency with
// itself (opsets, tensor sizes, external data inside the model's folder) but not yet interpreted
// as a graph (frontend/onnx/import_graph.h does that). No protobuf type appears here: only
// src/io/onnx/*.cc see onnx.proto's generated code.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace kiln {

// TensorProto.DataType, with onnx.proto's numbers.
enum class OnnxElemType : int32_t {
  kUndefined = 0,
  kFloat = 1,
  kUint8 = 2,
  kInt8 = 3,
  kUint16 = 4,
  kInt16 = 5,
  kInt32 = 6,
  kInt64 = 7,
  kString = 8,
  kBool = 9,
  kFloat16 = 10,
  kDouble = 11,
  kUint32 = 12,
  kUint64 = 13,
  kComplex64 = 14,
  kComplex128 = 15,
  kBFloat16 = 16,
};
// "float", "int64", ...; "type 99" for a number onnx.proto does not define.
std::string onnx_elem_type_name(OnnxElemType type);
// Bytes per element; 0 for strings and undefined or unknown types.
size_t onnx_elem_type_bytes(OnnxElemType type);
// The kiln dtype whose bytes are the same as the ONNX type's: bool and uint8 are held as i8
// (their bytes unchanged; OnnxTensor::type says what they are). False when kiln has none.
bool onnx_elem_type_to_dtype(OnnxElemType type, DType* out);

// One dimension of a tensor shape: a number, a symbolic name (dim_param: "batch"), or unknown.
struct OnnxDim {
  int64_t value = -1;  // -1 unless the dimension is a number
  std::string param;   // the symbolic name, when it has one
  bool is_static() const { return value >= 0; }
};
// "[batch, 8, ?]"
std::string onnx_shape_str(const std::vector<OnnxDim>& dims);

// A graph input, output or intermediate value's declared type.
struct OnnxValueInfo {
  std::string name;
  OnnxElemType type = OnnxElemType::kUndefined;
  // Absent: the rank is unknown.
  std::optional<std::vector<OnnxDim>> shape;
};

// An initializer or a tensor-valued attribute. `data` holds the elements when kiln has a dtype
// with their bytes (onnx_elem_type_to_dtype): a view of the file's mapping for aligned external
// data, else an aligned copy. Otherwise `data` is undefined and `bytes` still counts them.
struct OnnxTensor {
  std::string name;
  OnnxElemType type = OnnxElemType::kUndefined;
  Shape dims;
  Tensor data;
  size_t bytes = 0;
  // Where the bytes were: the external data file relative to the model's folder, or empty.
  std::string external_location;
};

struct OnnxGraph;

// AttributeProto.AttributeType, with onnx.proto's numbers.
enum class OnnxAttrKind : int32_t {
  kUndefined = 0,
  kFloat = 1,
  kInt = 2,
  kString = 3,
  kTensor = 4,
  kGraph = 5,
  kFloats = 6,
  kInts = 7,
  kStrings = 8,
  kTensors = 9,
  kGraphs = 10,
  kSparseTensor = 11,
  kSparseTensors = 12,
  kTypeProto = 13,
  kTypeProtos = 14,
};
std::string_view onnx_attr_kind_name(OnnxAttrKind kind);

// One node attribute; only the member its kind names is set. Sparse tensors and type protos are
// recorded by kind only (no op kiln imports takes them).
struct OnnxAttribute {
  std::string name;
  OnnxAttrKind kind = OnnxAttrKind::kUndefined;
  float f = 0;
  int64_t i = 0;
  std::string s;
  std::vector<float> floats;
  std::vector<int64_t> ints;
  std::vector<std::string> strings;
  std::vector<OnnxTensor> tensors;                 // kTensor: one; kTensors: any
  std::vector<std::shared_ptr<OnnxGraph>> graphs;  // kGraph: one; kGraphs: any
};

struct OnnxNode {
  std::string name;  // may be empty in the file; then "OpType#index" (its place in the graph)
  std::string op_type;
  std::string domain;  // "" for the default domain (ai.onnx)
  // Value names; an empty name is an omitted optional input or output.
  std::vector<std::string> inputs;
  std::vector<std::string> outputs;
  std::vector<OnnxAttribute> attributes;
  const OnnxAttribute* find_attribute(std::string_view name) const;
};

struct OnnxGraph {
  std::string name;
  std::vector<OnnxNode> nodes;
  std::vector<OnnxTensor> initializers;
  std::vector<OnnxValueInfo> inputs;
  std::vector<OnnxValueInfo> outputs;
  std::vector<OnnxValueInfo> value_info;  // intermediate values the exporter annotated
};

struct OnnxModel {
  std::string path;
  int64_t ir_version = 0;
  int64_t opset = 0;                            // the default domain's
  std::map<std::string, int64_t> other_opsets;  // domain -> version (e.g. "com.microsoft")
  std::string producer_name;
  std::string producer_version;
  OnnxGraph graph;
};

// The default domain's opsets kiln reads.
inline constexpr int64_t kOnnxMinOpset = 13;
inline constexpr int64_t kOnnxMaxOpset = 18;

// Reads and checks an .onnx file: a clear error naming the file for a missing, unreadable,
// truncated or corrupt file, an opset outside 13–18, tensors whose data does not match their
// shape, and external data that is absent, escapes the model's folder or lies past its file's end.
OnnxModel read_onnx_model(const std::string& path);

}  // namespace kiln
