// KServe v2 inference requests and responses as tensors: the JSON form and the binary tensor
// data extension (Inference-Header-Content-Length: the JSON header, then each binary tensor's
// bytes in order; BYTES elements as a 4-byte little-endian length and the bytes). Pure
// functions of their inputs, so the parsing of hostile bodies is tested on its own (under ASan).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "server/generation_service.h"
#include "server/model_repository.h"

namespace kiln::server {

struct InferRequest {
  std::string id;
  std::vector<std::string> prompts;  // the text input's elements, in order
  std::vector<int64_t> shape;        // the text input's shape (the outputs take its batch shape)
  RequestParams params;
  bool binary_text = false;       // text_output as binary data
  bool binary_token_ids = false;  // token_ids as binary data
  bool want_text = true;
  bool want_token_ids = false;
};

// `header_length`: the Inference-Header-Content-Length header, or nullopt when the whole body is
// JSON. Throws kBadRequest naming the tensor or field at fault.
InferRequest parse_infer_request(const std::string& body, std::optional<int64_t> header_length,
                                 const ModelSettings& settings);

struct InferResponseBody {
  std::string body;
  std::optional<int64_t> header_length;  // set when binary data follows the JSON
  std::string content_type;
};

InferResponseBody make_infer_response(const InferRequest& req, const std::string& model,
                                      int64_t version, const ModelSettings& settings,
                                      const std::vector<Completion>& results);

// Splits raw BYTES tensor data into its elements; throws kBadRequest naming `tensor` when a
// length runs past the data or bytes are left over.
std::vector<std::string> decode_bytes_elements(const std::string& raw, const std::string& tensor);
std::string encode_bytes_elements(const std::vector<std::string>& elements);

}  // namespace kiln::server
