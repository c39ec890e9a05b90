// KServe v2 tensors in JSON and binary form.
#include "server/infer_tensors.h"

#include <cstring>

namespace kiln::server {

namespace {

using Json = nlohmann::json;

void flatten(const Json& data, std::vector<Json>& out, int depth) {
  KILN_BAD_REQUEST(depth < 8, "tensor data is nested too deeply");
  if (data.is_array()) {
    for (const Json& d : data) flatten(d, out, depth + 1);
  } else {
    out.push_back(data);
  }
}

int64_t element_count(const Json& shape, const std::string& name) {
  KILN_BAD_REQUEST(shape.is_array() && !shape.empty() && shape.size() <= 4,
                   "input \"{}\": \"shape\" must be a list of 1..4 dimensions", name);
  int64_t n = 1;
  for (const Json& d : shape) {
    KILN_BAD_REQUEST(d.is_number_integer() && d.get<int64_t>() >= 0 && d.get<int64_t>() <= 4096,
                     "input \"{}\": shape dimensions must be integers in 0..4096, got {}", name,
                     d.dump());
    n *= d.get<int64_t>();
  }
  KILN_BAD_REQUEST(n <= 4096, "input \"{}\": {} elements; at most 4096", name, n);
  return n;
}

// Binary tensor data of `size` bytes taken from the part after the JSON header.
std::string take_binary(const std::string& body, size_t& offset, const Json& size,
                        const std::string& name) {
  KILN_BAD_REQUEST(size.is_number_integer() && size.get<int64_t>() >= 0,
                   "input \"{}\": binary_data_size must be a non-negative integer", name);
  const auto n = static_cast<uint64_t>(size.get<int64_t>());
  KILN_BAD_REQUEST(n <= body.size() - offset,
                   "input \"{}\": binary_data_size {} runs past the end of the body ({} bytes "
                   "of binary data left)",
                   name, n, body.size() - offset);
  std::string out = body.substr(offset, n);
  offset += n;
  return out;
}

// A numeric/bool tensor element from binary data.
Json binary_scalar(const std::string& raw, const std::string& datatype, const std::string& name) {
  auto need = [&](size_t n) {
    KILN_BAD_REQUEST(raw.size() == n,
                     "input \"{}\": {} data must be {} bytes for one element, got "
                     "{}",
                     name, datatype, n, raw.size());
  };
  if (datatype == "BOOL") {
    need(1);
    return raw[0] != 0;
  }
  if (datatype == "INT32") {
    need(4);
    int32_t v;
    std::memcpy(&v, raw.data(), 4);
    return v;
  }
  if (datatype == "INT64") {
    need(8);
    int64_t v;
    std::memcpy(&v, raw.data(), 8);
    return v;
  }
  if (datatype == "UINT64") {
    need(8);
    uint64_t v;
    std::memcpy(&v, raw.data(), 8);
    return v;
  }
  if (datatype == "UINT32") {
    need(4);
    uint32_t v;
    std::memcpy(&v, raw.data(), 4);
    return v;
  }
  if (datatype == "FP32") {
    need(4);
    float v;
    std::memcpy(&v, raw.data(), 4);
    return v;
  }
  if (datatype == "FP64") {
    need(8);
    double v;
    std::memcpy(&v, raw.data(), 8);
    return v;
  }
  KILN_SERVER_FAIL(Code::kBadRequest, "input \"{}\": datatype {} is not supported for a parameter",
                   name, datatype);
}

}  // namespace

std::vector<std::string> decode_bytes_elements(const std::string& raw, const std::string& tensor) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < raw.size()) {
    KILN_BAD_REQUEST(raw.size() - i >= 4,
                     "tensor \"{}\": {} bytes left where a 4-byte element length was expected",
                     tensor, raw.size() - i);
    uint32_t len;
    std::memcpy(&len, raw.data() + i, 4);  // little-endian, as x86 is
    i += 4;
    KILN_BAD_REQUEST(len <= raw.size() - i,
                     "tensor \"{}\": element {} is {} bytes long but only {} bytes follow", tensor,
                     out.size(), len, raw.size() - i);
    out.emplace_back(raw.data() + i, len);
    i += len;
  }
  return out;
}

std::string encode_bytes_elements(const std::vector<std::string>& elements) {
  std::string out;
  for (const std::string& e : elements) {
    const auto len = static_cast<uint32_t>(e.size());
    out.append(reinterpret_cast<const char*>(&len), 4);
    out += e;
  }
  return out;
}

InferRequest parse_infer_request(const std::string& body, std::optional<int64_t> header_length,
                                 const ModelSettings& settings) {
  InferRequest r;
  size_t json_len = body.size();
  if (header_length) {
    KILN_BAD_REQUEST(*header_length >= 0 && static_cast<uint64_t>(*header_length) <= body.size(),
                     "Inference-Header-Content-Length {} is past the end of the {}-byte body",
                     *header_length, body.size());
    json_len = static_cast<size_t>(*header_length);
  }
  const Json j = Json::parse(body.begin(), body.begin() + static_cast<std::ptrdiff_t>(json_len),
                             nullptr, false);
  KILN_BAD_REQUEST(!j.is_discarded(), "the inference request is not valid JSON");
  KILN_BAD_REQUEST(j.is_object(), "the inference request must be a JSON object");
  size_t offset = json_len;
  if (j.contains("id")) {
    KILN_BAD_REQUEST(j["id"].is_string(), "\"id\" must be a string");
    r.id = j["id"].get<std::string>();
  }
  bool all_binary = false;
  if (j.contains("parameters")) {
    const Json& p = j["parameters"];
    KILN_BAD_REQUEST(p.is_object(), "\"parameters\" must be an object");
    for (const auto& [key, value] : p.items()) {
      if (key == "binary_data_output") {
        KILN_BAD_REQUEST(value.is_boolean(), "parameter \"binary_data_output\" must be a bool");
        all_binary = value.get<bool>();
      } else if (key == "priority" || key == "headers") {
        continue;  // Triton's; kiln has one priority
      } else if (!r.params.set(key, value)) {
        KILN_SERVER_FAIL(Code::kBadRequest, "unknown parameter \"{}\"", key);
      }
    }
  }
  KILN_BAD_REQUEST(j.contains("inputs") && j["inputs"].is_array() && !j["inputs"].empty(),
                   "\"inputs\" must be a non-empty list of tensors");
  bool have_text = false;
  for (const Json& in : j["inputs"]) {
    KILN_BAD_REQUEST(in.is_object() && in.contains("name") && in["name"].is_string(),
                     "each input needs a \"name\" string");
    const std::string name = in["name"].get<std::string>();
    KILN_BAD_REQUEST(in.contains("datatype") && in["datatype"].is_string(),
                     "input \"{}\" needs a \"datatype\" string", name);
    const std::string dt = in["datatype"].get<std::string>();
    KILN_BAD_REQUEST(in.contains("shape"), "input \"{}\" needs a \"shape\"", name);
    const int64_t count = element_count(in["shape"], name);
    std::optional<std::string> raw;
    if (in.contains("parameters")) {
      KILN_BAD_REQUEST(in["parameters"].is_object(), "input \"{}\": parameters must be an object",
                       name);
      if (in["parameters"].contains("binary_data_size"))
        raw = take_binary(body, offset, in["parameters"]["binary_data_size"], name);
    }
    KILN_BAD_REQUEST(raw || in.contains("data"),
                     "input \"{}\" has neither \"data\" nor binary data", name);
    if (name == settings.input_name) {
      KILN_BAD_REQUEST(dt == "BYTES", "input \"{}\" must be BYTES (text), got {}", name, dt);
      KILN_BAD_REQUEST(!have_text, "input \"{}\" is given twice", name);
      have_text = true;
      if (raw) {
        r.prompts = decode_bytes_elements(*raw, name);
      } else {
        std::vector<Json> flat;
        flatten(in["data"], flat, 0);
        for (const Json& e : flat) {
          KILN_BAD_REQUEST(e.is_string(), "input \"{}\": BYTES data must be strings, got {}", name,
                           e.dump());
          r.prompts.push_back(e.get<std::string>());
        }
      }
      KILN_BAD_REQUEST(static_cast<int64_t>(r.prompts.size()) == count,
                       "input \"{}\": shape {} has {} elements but the data has {}", name,
                       in["shape"].dump(), count, r.prompts.size());
      KILN_BAD_REQUEST(count >= 1 && count <= 64, "input \"{}\": 1..64 prompts per request, got {}",
                       name, count);
      for (const Json& d : in["shape"]) r.shape.push_back(d.get<int64_t>());
      continue;
    }
    KILN_BAD_REQUEST(is_request_parameter(name),
                     "unknown input \"{}\"; this model takes \"{}\" (BYTES) and optional "
                     "parameter inputs (max_tokens, temperature, top_k, top_p, seed, beam_width, "
                     "stop, return_token_ids, ...)",
                     name, settings.input_name);
    Json value;
    if (name == "stop" || name == "stop_words") {
      KILN_BAD_REQUEST(dt == "BYTES", "input \"{}\" must be BYTES", name);
      std::vector<std::string> words;
      if (raw) {
        words = decode_bytes_elements(*raw, name);
      } else {
        std::vector<Json> flat;
        flatten(in["data"], flat, 0);
        for (const Json& e : flat) {
          KILN_BAD_REQUEST(e.is_string(), "input \"{}\" must hold strings", name);
          words.push_back(e.get<std::string>());
        }
      }
      value = words;
    } else {
      KILN_BAD_REQUEST(count == 1, "input \"{}\" must have one element, got {}", name, count);
      if (raw) {
        value = binary_scalar(*raw, dt, name);
      } else {
        std::vector<Json> flat;
        flatten(in["data"], flat, 0);
        KILN_BAD_REQUEST(flat.size() == 1, "input \"{}\" must have one element", name);
        value = flat[0];
      }
    }
    r.params.set(name, value);
  }
  KILN_BAD_REQUEST(have_text, "input \"{}\" (the prompt, BYTES) is missing", settings.input_name);
  KILN_BAD_REQUEST(offset == body.size(), "{} bytes of binary data follow the last input's",
                   body.size() - offset);
  // Requested outputs: none listed means all (text only, unless token ids were asked for).
  r.want_token_ids = r.params.return_token_ids;
  r.binary_text = r.binary_token_ids = all_binary;
  if (j.contains("outputs")) {
    KILN_BAD_REQUEST(j["outputs"].is_array(), "\"outputs\" must be a list");
    if (!j["outputs"].empty()) r.want_text = false;
    for (const Json& out : j["outputs"]) {
      KILN_BAD_REQUEST(out.is_object() && out.contains("name") && out["name"].is_string(),
                       "each requested output needs a \"name\" string");
      const std::string name = out["name"].get<std::string>();
      bool binary = all_binary;
      if (out.contains("parameters")) {
        const Json& p = out["parameters"];
        KILN_BAD_REQUEST(p.is_object(), "output \"{}\": parameters must be an object", name);
        if (p.contains("binary_data")) {
          KILN_BAD_REQUEST(p["binary_data"].is_boolean(),
                           "output \"{}\": binary_data must be a bool", name);
          binary = p["binary_data"].get<bool>();
        }
      }
      if (name == settings.output_name) {
        r.want_text = true;
        r.binary_text = binary;
      } else if (name == "token_ids") {
        r.want_token_ids = true;
        r.binary_token_ids = binary;
      } else {
        KILN_SERVER_FAIL(Code::kBadRequest,
                         "unknown output \"{}\"; this model gives \"{}\" and "
                         "\"token_ids\"",
                         name, settings.output_name);
      }
    }
  }
  return r;
}

InferResponseBody make_infer_response(const InferRequest& req, const std::string& model,
                                      int64_t version, const ModelSettings& settings,
                                      const std::vector<Completion>& results) {
  Json head{{"model_name", model}, {"model_version", std::to_string(version)}};
  if (!req.id.empty()) head["id"] = req.id;
  Json outputs = Json::array();
  std::string binary;
  if (req.want_text) {
    std::vector<std::string> texts;
    for (const Completion& c : results) texts.push_back(c.text);
    Json o{{"name", settings.output_name}, {"datatype", "BYTES"}, {"shape", req.shape}};
    if (req.binary_text) {
      const std::string raw = encode_bytes_elements(texts);
      o["parameters"] = {{"binary_data_size", raw.size()}};
      binary += raw;
    } else {
      o["data"] = texts;
    }
    outputs.push_back(o);
  }
  if (req.want_token_ids) {
    // [prompts, longest]: shorter rows are padded with -1.
    size_t longest = 0;
    for (const Completion& c : results) longest = std::max(longest, c.token_ids.size());
    std::vector<int64_t> ids;
    for (const Completion& c : results) {
      ids.insert(ids.end(), c.token_ids.begin(), c.token_ids.end());
      ids.insert(ids.end(), longest - c.token_ids.size(), -1);
    }
    Json o{{"name", "token_ids"},
           {"datatype", "INT64"},
           {"shape", {static_cast<int64_t>(results.size()), static_cast<int64_t>(longest)}}};
    if (req.binary_token_ids) {
      const std::string raw(reinterpret_cast<const char*>(ids.data()), ids.size() * 8);
      o["parameters"] = {{"binary_data_size", raw.size()}};
      binary += raw;
    } else {
      o["data"] = ids;
    }
    outputs.push_back(o);
  }
  head["outputs"] = outputs;
  InferResponseBody out;
  out.body = head.dump(-1, ' ', false, Json::error_handler_t::replace);
  if (binary.empty()) {
    out.content_type = "application/json";
    return out;
  }
  out.header_length = static_cast<int64_t>(out.body.size());
  out.body += binary;
  out.content_type = "application/octet-stream";
  return out;
}

}  // namespace kiln::server
