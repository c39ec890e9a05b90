#include <charconv>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "io/onnx/onnx_tensor_decode.h"

namespace kiln {
namespace onnx_detail {
namespace fs = std::filesystem;
namespace {

int64_t parse_external_int(const std::string& text, const std::string& key, const std::string& what,
                           const std::string& model_path) {
  int64_t v = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  KILN_CHECK(ec == std::errc() && end == text.data() + text.size() && v >= 0,
             "{}: {}: external data {} '{}' is not a non-negative integer", model_path, what, key,
             text);
  return v;
}

// The external data file, checked to be inside the model's folder (after following symlinks).
std::shared_ptr<MappedFile> open_external_file(const std::string& location, ExternalData& ext,
                                               const std::string& what) {
  KILN_CHECK(!location.empty(), "{}: {}: external data without a location", ext.model_path, what);
  const fs::path rel(location);
  KILN_CHECK(!rel.is_absolute(),
             "{}: {}: external data location '{}' is an absolute path; it must be relative to "
             "the model's folder {}",
             ext.model_path, what, location, ext.model_dir.string());
  const fs::path normal = rel.lexically_normal();
  KILN_CHECK(normal.empty() || *normal.begin() != "..",
             "{}: {}: external data location '{}' is outside the model's folder {}", ext.model_path,
             what, location, ext.model_dir.string());
  const fs::path full = ext.model_dir / rel;
  std::error_code ec;
  if (!fs::exists(full, ec))
    KILN_FAIL_KIND(ErrorKind::kNotFound, "{}: {}: external data file {} not found", ext.model_path,
                   what, full.string());
  const fs::path real = fs::canonical(full, ec);
  KILN_CHECK(!ec, "{}: {}: cannot resolve external data file {}: {}", ext.model_path, what,
             full.string(), ec.message());
  const fs::path dir = fs::canonical(ext.model_dir, ec);
  KILN_CHECK(!ec, "{}: cannot resolve the model's folder {}: {}", ext.model_path,
             ext.model_dir.string(), ec.message());
  const fs::path inside = real.lexically_relative(dir);
  KILN_CHECK(!inside.empty() && *inside.begin() != "..",
             "{}: {}: external data location '{}' leads to {}, outside the model's folder {} "
             "(through a symbolic link)",
             ext.model_path, what, location, real.string(), dir.string());
  auto& file = ext.files[real.string()];
  if (!file) file = MappedFile::open(real.string());
  return file;
}

OnnxTensor external_tensor(const onnx::TensorProto& proto, OnnxTensor t, bool has_dtype,
                           DType dtype, ExternalData& ext, const std::string& what) {
  std::string location;
  int64_t offset = 0, length = -1;
  for (const auto& kv : proto.external_data()) {
    if (kv.key() == "location")
      location = kv.value();
    else if (kv.key() == "offset")
      offset = parse_external_int(kv.value(), "offset", what, ext.model_path);
    else if (kv.key() == "length")
      length = parse_external_int(kv.value(), "length", what, ext.model_path);
  }
  const std::shared_ptr<MappedFile> file = open_external_file(location, ext, what);
  const size_t size = file->size();
  KILN_CHECK(static_cast<uint64_t>(offset) <= size,
             "{}: {}: external data offset {} is past the end of {} ({} bytes)", ext.model_path,
             what, offset, file->path(), size);
  KILN_CHECK(length < 0 || static_cast<size_t>(length) == t.bytes,
             "{}: {}: external data length {} does not match its shape {} of {} ({} bytes)",
             ext.model_path, what, length, shape_str(t.dims), onnx_elem_type_name(t.type), t.bytes);
  KILN_CHECK(t.bytes <= size - static_cast<size_t>(offset),
             "{}: {}: external data [{}, {}) lies past the end of {} ({} bytes)", ext.model_path,
             what, offset, static_cast<uint64_t>(offset) + t.bytes, file->path(), size);
  t.external_location = location;
  if (!has_dtype) return t;
  const char* p = file->data() + offset;
  const size_t align = onnx_elem_type_bytes(t.type);
  if (reinterpret_cast<uintptr_t>(p) % align == 0) {
    t.data = Tensor::mapped(dtype, t.dims, p, file);
  } else {  // unaligned elements are copied rather than read in place
    t.data = Tensor::empty(dtype, t.dims);
    std::memcpy(t.data.raw(), p, t.bytes);
  }
  return t;
}

// Checks that a typed field holds one value per element.
void check_count(const OnnxTensor& t, int64_t numel, int count, const char* field,
                 const std::string& what, const std::string& model_path) {
  KILN_CHECK(count == numel,
             "{}: {}: {} tensor of shape {} has {} values in {}, expected {} (truncated or "
             "damaged file?)",
             model_path, what, onnx_elem_type_name(t.type), shape_str(t.dims), count, field, numel);
}

template <typename Dst, typename Src>
void copy_converted(const Src& field, Tensor& data) {
  auto* dst = static_cast<Dst*>(data.raw());
  for (int i = 0; i < field.size(); ++i) dst[i] = static_cast<Dst>(field.Get(i));
}

}  // namespace

OnnxTensor decode_onnx_tensor(const onnx::TensorProto& proto, ExternalData& ext,
                              const std::string& what) {
  OnnxTensor t;
  t.name = proto.name();
  t.type = static_cast<OnnxElemType>(proto.data_type());
  for (int64_t d : proto.dims()) {
    KILN_CHECK(d >= 0, "{}: {}: negative dimension {}", ext.model_path, what, d);
    t.dims.push_back(d);
  }
  int64_t numel = 1;
  for (int64_t d : t.dims)
    KILN_CHECK(!__builtin_mul_overflow(numel, d, &numel), "{}: {}: shape {} has too many elements",
               ext.model_path, what, shape_str(t.dims));
  const size_t elem = onnx_elem_type_bytes(t.type);
  KILN_CHECK(elem != 0 || t.type == OnnxElemType::kString,
             "{}: {}: element type {} is not a tensor type ONNX defines", ext.model_path, what,
             onnx_elem_type_name(t.type));
  if (t.type == OnnxElemType::kString) {
    KILN_CHECK(proto.data_location() != onnx::TensorProto::EXTERNAL,
               "{}: {}: string tensors cannot be external data", ext.model_path, what);
    check_count(t, numel, proto.string_data_size(), "string_data", what, ext.model_path);
    for (const std::string& s : proto.string_data()) t.bytes += s.size();
    return t;
  }
  KILN_CHECK(!__builtin_mul_overflow(static_cast<size_t>(numel), elem, &t.bytes),
             "{}: {}: shape {} has too many bytes", ext.model_path, what, shape_str(t.dims));
  DType dtype = DType::kF32;
  const bool has_dtype = onnx_elem_type_to_dtype(t.type, &dtype);

  if (proto.data_location() == onnx::TensorProto::EXTERNAL)
    return external_tensor(proto, std::move(t), has_dtype, dtype, ext, what);
  if (proto.has_raw_data()) {
    KILN_CHECK(proto.raw_data().size() == t.bytes,
               "{}: {}: raw_data has {} bytes, its shape {} of {} needs {}", ext.model_path, what,
               proto.raw_data().size(), shape_str(t.dims), onnx_elem_type_name(t.type), t.bytes);
    if (has_dtype) {
      t.data = Tensor::empty(dtype, t.dims);
      if (t.bytes != 0) std::memcpy(t.data.raw(), proto.raw_data().data(), t.bytes);
    }
    return t;
  }
  // Typed fields (onnx.proto says which type uses which field).
  switch (t.type) {
    case OnnxElemType::kFloat:
      check_count(t, numel, proto.float_data_size(), "float_data", what, ext.model_path);
      break;
    case OnnxElemType::kInt64:
      check_count(t, numel, proto.int64_data_size(), "int64_data", what, ext.model_path);
      break;
    case OnnxElemType::kDouble:
      check_count(t, numel, proto.double_data_size(), "double_data", what, ext.model_path);
      break;
    case OnnxElemType::kUint32:
    case OnnxElemType::kUint64:
      check_count(t, numel, proto.uint64_data_size(), "uint64_data", what, ext.model_path);
      break;
    case OnnxElemType::kComplex64:
    case OnnxElemType::kComplex128:
      KILN_FAIL("{}: {}: complex tensors are not supported", ext.model_path, what);
    case OnnxElemType::kUint8:
    case OnnxElemType::kInt8:
    case OnnxElemType::kUint16:
    case OnnxElemType::kInt16:
    case OnnxElemType::kInt32:
    case OnnxElemType::kBool:
    case OnnxElemType::kFloat16:
    case OnnxElemType::kBFloat16:
      check_count(t, numel, proto.int32_data_size(), "int32_data", what, ext.model_path);
      break;
    case OnnxElemType::kUndefined:
    case OnnxElemType::kString:
      break;  // rejected above
  }
  if (!has_dtype) return t;
  t.data = Tensor::empty(dtype, t.dims);
  switch (dtype) {
    case DType::kF32:
      copy_converted<float>(proto.float_data(), t.data);
      break;
    case DType::kI64:
      copy_converted<int64_t>(proto.int64_data(), t.data);
      break;
    case DType::kI32:
      copy_converted<int32_t>(proto.int32_data(), t.data);
      break;
    case DType::kI8:  // int8, uint8 and bool: the low byte of each int32
      copy_converted<int8_t>(proto.int32_data(), t.data);
      break;
    case DType::kF16:
    case DType::kBF16:  // the 16 bits of each value are in the low half of an int32
      copy_converted<uint16_t>(proto.int32_data(), t.data);
      break;
    case DType::kF8E4M3:
    case DType::kF8E5M2:
    case DType::kI4:
      KILN_FAIL("{}: {}: no ONNX type maps to {}", ext.model_path, what, dtype_name(dtype));
  }
  return t;
}

}  // namespace onnx_detail

std::string onnx_elem_type_name(OnnxElemType type) {
  switch (type) {
    case OnnxElemType::kUndefined:
      return "undefined";
    case OnnxElemType::kFloat:
      return "float";
    case OnnxElemType::kUint8:
      return "uint8";
    case OnnxElemType::kInt8:
      return "int8";
    case OnnxElemType::kUint16:
      return "uint16";
    case OnnxElemType::kInt16:
      return "int16";
    case OnnxElemType::kInt32:
      return "int32";
    case OnnxElemType::kInt64:
      return "int64";
    case OnnxElemType::kString:
      return "string";
    case OnnxElemType::kBool:
      return "bool";
    case OnnxElemType::kFloat16:
      return "float16";
    case OnnxElemType::kDouble:
      return "double";
    case OnnxElemType::kUint32:
      return "uint32";
    case OnnxElemType::kUint64:
      return "uint64";
    case OnnxElemType::kComplex64:
      return "complex64";
    case OnnxElemType::kComplex128:
      return "complex128";
    case OnnxElemType::kBFloat16:
      return "bfloat16";
  }
  return fmt::format("type {}", static_cast<int32_t>(type));
}

size_t onnx_elem_type_bytes(OnnxElemType type) {
  switch (type) {
    case OnnxElemType::kUndefined:
    case OnnxElemType::kString:
      return 0;
    case OnnxElemType::kUint8:
    case OnnxElemType::kInt8:
    case OnnxElemType::kBool:
      return 1;
    case OnnxElemType::kUint16:
    case OnnxElemType::kInt16:
    case OnnxElemType::kFloat16:
    case OnnxElemType::kBFloat16:
      return 2;
    case OnnxElemType::kFloat:
    case OnnxElemType::kInt32:
    case OnnxElemType::kUint32:
      return 4;
    case OnnxElemType::kInt64:
    case OnnxElemType::kDouble:
    case OnnxElemType::kUint64:
    case OnnxElemType::kComplex64:
      return 8;
    case OnnxElemType::kComplex128:
      return 16;
  }
  return 0;  // a number onnx.proto does not define
}

bool onnx_elem_type_to_dtype(OnnxElemType type, DType* out) {
  switch (type) {
    case OnnxElemType::kFloat:
      *out = DType::kF32;
      return true;
    case OnnxElemType::kFloat16:
      *out = DType::kF16;
      return true;
    case OnnxElemType::kBFloat16:
      *out = DType::kBF16;
      return true;
    case OnnxElemType::kInt8:
    case OnnxElemType::kUint8:
    case OnnxElemType::kBool:
      *out = DType::kI8;
      return true;
    case OnnxElemType::kInt32:
      *out = DType::kI32;
      return true;
    case OnnxElemType::kInt64:
      *out = DType::kI64;
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

std::string onnx_shape_str(const std::vector<OnnxDim>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ", ";
    s += dims[i].is_static() ? std::to_string(dims[i].value)
                             : (dims[i].param.empty() ? "?" : dims[i].param);
  }
  return s + "]";
}

}  // namespace kiln
