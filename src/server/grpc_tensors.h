// Tensors of the KServe v2 gRPC protocol (grpc_service.proto) as kiln's text generation needs
// them: BYTES prompts in either encoding, scalar parameter tensors, InferParameter values.
// Kept apart from the service so that the decoding of client bytes can be tested (under ASan)
// without a server.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "grpc_service.pb.h"

namespace kiln::server {

using InferInput = inference::ModelInferRequest::InferInputTensor;

// Triton's raw BYTES encoding: each element is a 4-byte little-endian length followed by that
// many bytes, elements back to back. Decodes exactly `count` elements; a length that runs past
// the buffer, a truncated length prefix or bytes left over throw a kBadRequest ServerError
// naming `tensor`.
std::vector<std::string> decode_raw_bytes(std::string_view raw, int64_t count,
                                          const std::string& tensor);
std::string encode_raw_bytes(const std::vector<std::string>& elements);
void append_raw_bytes(std::string& out, std::string_view element);

// The number of elements of a shape; negative dimensions, overflow or more than `limit`
// elements throw a kBadRequest naming `tensor`.
int64_t element_count(const google::protobuf::RepeatedField<int64_t>& shape,
                      const std::string& tensor, int64_t limit = int64_t{1} << 32);

// A BYTES input's elements, from `raw` (when the request used raw_input_contents) or from its
// contents.bytes_contents. Checks the datatype and that the count matches the shape.
std::vector<std::string> bytes_elements(const InferInput& input, const std::string* raw);

// What a parameter input tensor holds, for RequestParams::set: a single element becomes a JSON
// scalar (shape [1], [1,1] or []), a BYTES tensor of any length (`stop`) a JSON array of strings.
// Integer, unsigned, float and BOOL datatypes are read from their contents field or from `raw`
// (little-endian); other datatypes or counts throw a kBadRequest naming the tensor.
nlohmann::json parameter_tensor_value(const InferInput& input, const std::string* raw);

// A request parameter as JSON (bool, int64, uint64, double or string); an unset one is null.
nlohmann::json parameter_value(const inference::InferParameter& p);

}  // namespace kiln::server
