#include "server/grpc_tensors.h"

#include <cstring>
#include <limits>

#include "server/errors.h"

namespace kiln::server {

namespace {

uint32_t load_le32(const char* p) {
  const auto* b = reinterpret_cast<const unsigned char*>(p);
  return static_cast<uint32_t>(b[0]) | static_cast<uint32_t>(b[1]) << 8 |
         static_cast<uint32_t>(b[2]) << 16 | static_cast<uint32_t>(b[3]) << 24;
}

// Little-endian integer of `size` bytes at `p`, sign-extended when `is_signed`.
int64_t load_le(const char* p, size_t size, bool is_signed) {
  uint64_t v = 0;
  for (size_t i = 0; i < size; ++i)
    v |= static_cast<uint64_t>(static_cast<unsigned char>(p[i])) << (8 * i);
  if (is_signed && size < 8 && (v >> (8 * size - 1)) & 1) v |= ~uint64_t{0} << (8 * size);
  return static_cast<int64_t>(v);
}

// The element size of the fixed-size datatypes kiln reads (0: not one of them).
size_t fixed_size(const std::string& datatype) {
  if (datatype == "BOOL" || datatype == "INT8" || datatype == "UINT8") return 1;
  if (datatype == "INT16" || datatype == "UINT16") return 2;
  if (datatype == "INT32" || datatype == "UINT32" || datatype == "FP32") return 4;
  if (datatype == "INT64" || datatype == "UINT64" || datatype == "FP64") return 8;
  return 0;
}

}  // namespace

std::vector<std::string> decode_raw_bytes(std::string_view raw, int64_t count,
                                          const std::string& tensor) {
  std::vector<std::string> out;
  size_t offset = 0;
  for (int64_t i = 0; i < count; ++i) {
    KILN_BAD_REQUEST(raw.size() - offset >= 4,
                     "input '{}': raw BYTES element {} needs a 4-byte length at byte {}, but the "
                     "contents are {} bytes",
                     tensor, i, offset, raw.size());
    const uint32_t length = load_le32(raw.data() + offset);
    offset += 4;
    // Compared against what is left, so that a huge length cannot overflow the offset.
    KILN_BAD_REQUEST(length <= raw.size() - offset,
                     "input '{}': raw BYTES element {} is {} bytes long, but only {} bytes follow "
                     "its length",
                     tensor, i, length, raw.size() - offset);
    out.emplace_back(raw.substr(offset, length));
    offset += length;
  }
  KILN_BAD_REQUEST(
      offset == raw.size(),
      "input '{}': raw BYTES contents hold {} bytes after the {} elements of its shape", tensor,
      raw.size() - offset, count);
  return out;
}

void append_raw_bytes(std::string& out, std::string_view element) {
  const auto n = static_cast<uint32_t>(element.size());
  const char length[4] = {static_cast<char>(n & 0xff), static_cast<char>((n >> 8) & 0xff),
                          static_cast<char>((n >> 16) & 0xff), static_cast<char>(n >> 24)};
  out.append(length, 4);
  out.append(element);
}

std::string encode_raw_bytes(const std::vector<std::string>& elements) {
  std::string out;
  for (const auto& e : elements) append_raw_bytes(out, e);
  return out;
}

int64_t element_count(const google::protobuf::RepeatedField<int64_t>& shape,
                      const std::string& tensor, int64_t limit) {
  int64_t n = 1;
  for (int64_t d : shape) {
    KILN_BAD_REQUEST(d >= 0, "input '{}': shape dimension {} is negative", tensor, d);
    KILN_BAD_REQUEST(d == 0 || n <= limit / d, "input '{}': shape has more than {} elements",
                     tensor, limit);
    n *= d;
  }
  return n;
}

std::vector<std::string> bytes_elements(const InferInput& input, const std::string* raw) {
  KILN_BAD_REQUEST(input.datatype() == "BYTES", "input '{}': datatype is {}, expected BYTES",
                   input.name(), input.datatype());
  const int64_t count = element_count(input.shape(), input.name());
  if (raw != nullptr) return decode_raw_bytes(*raw, count, input.name());
  const auto& contents = input.contents().bytes_contents();
  KILN_BAD_REQUEST(contents.size() == count,
                   "input '{}': shape has {} elements, contents.bytes_contents {}", input.name(),
                   count, contents.size());
  return {contents.begin(), contents.end()};
}

nlohmann::json parameter_tensor_value(const InferInput& input, const std::string* raw) {
  const std::string& name = input.name();
  const std::string& type = input.datatype();
  if (type == "BYTES") {
    nlohmann::json array = nlohmann::json::array();
    for (auto& s : bytes_elements(input, raw)) array.push_back(std::move(s));
    return array;
  }
  const size_t size = fixed_size(type);
  KILN_BAD_REQUEST(size != 0,
                   "input '{}': datatype {} is not supported for a parameter (use an integer, "
                   "FP32, FP64, BOOL or BYTES)",
                   name, type);
  const int64_t count = element_count(input.shape(), name);
  KILN_BAD_REQUEST(count == 1, "input '{}': expected one element (shape [1]), the shape has {}",
                   name, count);
  const bool is_unsigned = type[0] == 'U';
  if (raw != nullptr) {
    KILN_BAD_REQUEST(raw->size() == size, "input '{}': raw contents are {} bytes, {} holds {}",
                     name, raw->size(), type, size);
    if (type == "BOOL") return (*raw)[0] != 0;
    if (type == "FP32") {
      float f;
      const uint32_t bits = static_cast<uint32_t>(load_le(raw->data(), 4, false));
      std::memcpy(&f, &bits, 4);
      return static_cast<double>(f);
    }
    if (type == "FP64") {
      double d;
      const uint64_t bits = static_cast<uint64_t>(load_le(raw->data(), 8, false));
      std::memcpy(&d, &bits, 8);
      return d;
    }
    const int64_t v = load_le(raw->data(), size, !is_unsigned);
    if (is_unsigned) return static_cast<uint64_t>(v);
    return v;
  }
  const auto& c = input.contents();
  // The contents field of the datatype (Triton: int_contents for INT8..INT32, uint_contents
  // for UINT8..UINT32).
  int filled = 0;
  nlohmann::json value;
  if (type == "BOOL") {
    filled = c.bool_contents_size();
    if (filled == 1) value = c.bool_contents(0);
  } else if (type == "INT64") {
    filled = c.int64_contents_size();
    if (filled == 1) value = c.int64_contents(0);
  } else if (type == "UINT64") {
    filled = c.uint64_contents_size();
    if (filled == 1) value = c.uint64_contents(0);
  } else if (type == "FP32") {
    filled = c.fp32_contents_size();
    if (filled == 1) value = static_cast<double>(c.fp32_contents(0));
  } else if (type == "FP64") {
    filled = c.fp64_contents_size();
    if (filled == 1) value = c.fp64_contents(0);
  } else if (is_unsigned) {
    filled = c.uint_contents_size();
    if (filled == 1) value = static_cast<uint64_t>(c.uint_contents(0));
  } else {
    filled = c.int_contents_size();
    if (filled == 1) value = static_cast<int64_t>(c.int_contents(0));
  }
  KILN_BAD_REQUEST(filled == 1, "input '{}': expected one {} value in its contents, got {}", name,
                   type, filled);
  return value;
}

nlohmann::json parameter_value(const inference::InferParameter& p) {
  using P = inference::InferParameter;
  switch (p.parameter_choice_case()) {
    case P::kBoolParam:
      return p.bool_param();
    case P::kInt64Param:
      return p.int64_param();
    case P::kStringParam:
      return p.string_param();
    case P::kDoubleParam:
      return p.double_param();
    case P::kUint64Param:
      return p.uint64_param();
    case P::PARAMETER_CHOICE_NOT_SET:
      return nullptr;
  }
  return nullptr;
}

}  // namespace kiln::server
