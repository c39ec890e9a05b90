#include "server/grpc_infer.h"

#include <algorithm>
#include <memory>
#include <optional>
#include <set>

#include "server/errors.h"
#include "server/grpc_frontend.h"
#include "server/grpc_tensors.h"

namespace kiln::server {

namespace {

using inference::InferParameter;
using inference::ModelInferRequest;
using inference::ModelInferResponse;
using inference::ModelStreamInferResponse;

// How often a waiting call looks whether its client is still there.
constexpr auto kPollInterval = std::chrono::milliseconds(100);
// Prompts one request may carry when the model's max_batch_size does not say.
constexpr int64_t kMaxPromptsPerRequest = 1024;

// Triton's request parameter asking for an empty final response on a decoupled stream; kiln
// always ends a request's responses with a final one, so it changes nothing.
constexpr const char* kEmptyFinalParameter = "triton_enable_empty_final_response";
constexpr const char* kFinalParameter = "triton_final_response";

bool has_contents(const ModelInferRequest::InferInputTensor& input) {
  return input.has_contents() && input.contents().ByteSizeLong() > 0;
}

std::string join_names(const std::vector<std::string>& names) {
  std::string out;
  for (const auto& n : names) out += (out.empty() ? "'" : ", '") + n + "'";
  return out;
}

std::string shape_text(const google::protobuf::RepeatedField<int64_t>& shape) {
  std::string out;
  for (int64_t d : shape) out += (out.empty() ? "" : ", ") + std::to_string(d);
  return "[" + out + "]";
}

void set_parameter(RequestParams& params, const std::string& key, const nlohmann::json& value,
                   std::vector<std::string>& unknown) {
  if (!params.set(key, value)) unknown.push_back(key);
}

// What a generation produced, read to its end.
struct Generated {
  std::string text;
  std::vector<int64_t> ids;
  FinishReason finish_reason = FinishReason::kLength;
};

// A generation that did not finish normally (error, timeout, cancelled by the server at
// shutdown or unload) is an error of its request, as collect() has it.
void throw_if_failed(const ResponseChunk& last) {
  if (last.cause != EndCause::kFinished) throw chunk_error(last);
}

// Reads `g` chunk by chunk, calling on_chunk(chunk) for each. Unlike collect(), it wakes every
// kPollInterval to see whether the client cancelled the call, hung up or let its deadline pass;
// then it returns false and the caller drops the Generation, which cancels it (its KV blocks
// are freed before the next step instead of generating to max_tokens for nobody).
template <typename OnChunk>
bool pump(Generation& g, grpc::ServerContext* context, OnChunk&& on_chunk) {
  std::vector<ResponseChunk> chunks;
  bool more = true;
  while (more) {
    chunks.clear();
    more = g.next(chunks, Clock::now() + kPollInterval);
    for (const auto& c : chunks) {
      if (!on_chunk(c)) return false;
    }
    if (more && context->IsCancelled()) return false;
  }
  return true;
}

void start_response(const LoadedModel& model, const ModelInferRequest& request,
                    ModelInferResponse& response) {
  response.set_model_name(model.name());
  response.set_model_version(std::to_string(model.version()));
  response.set_id(request.id());
}

void add_text_output(const LoadedModel& model, const InferPlan& plan,
                     const std::vector<std::string>& texts, ModelInferResponse& response) {
  auto* out = response.add_outputs();
  out->set_name(model.settings().output_name);
  out->set_datatype("BYTES");
  *out->mutable_shape() = plan.shape;
  if (plan.raw) {
    response.add_raw_output_contents(encode_raw_bytes(texts));
  } else {
    for (const auto& t : texts) out->mutable_contents()->add_bytes_contents(t);
  }
}

// INT64 [N, L]: a tensor is rectangular, so shorter rows of a batch are padded with -1 (no id).
void add_ids_output(const InferPlan& plan, const std::vector<std::vector<int64_t>>& ids,
                    ModelInferResponse& response) {
  size_t width = 0;
  for (const auto& row : ids) width = std::max(width, row.size());
  auto* out = response.add_outputs();
  out->set_name(kTokenIdsOutput);
  out->set_datatype("INT64");
  out->add_shape(static_cast<int64_t>(ids.size()));
  out->add_shape(static_cast<int64_t>(width));
  std::string raw;
  for (const auto& row : ids) {
    for (size_t i = 0; i < width; ++i) {
      const int64_t id = i < row.size() ? row[i] : -1;
      if (plan.raw) {
        for (int b = 0; b < 8; ++b)
          raw.push_back(static_cast<char>((static_cast<uint64_t>(id) >> (8 * b)) & 0xff));
      } else {
        out->mutable_contents()->add_int64_contents(id);
      }
    }
  }
  if (plan.raw) response.add_raw_output_contents(std::move(raw));
}

void set_final(ModelInferResponse& response, bool final) {
  InferParameter p;
  p.set_bool_param(final);
  (*response.mutable_parameters())[kFinalParameter] = p;
}

// One request of a stream: its responses written as the text comes. Returns false when the
// client went away (the stream is over).
bool stream_one(ModelManager& models, grpc::ServerContext* context,
                const ModelInferRequest& request,
                grpc::ServerReaderWriter<ModelStreamInferResponse, ModelInferRequest>* stream) {
  auto model = models.get(request.model_name(), request.model_version());
  InferPlan plan;
  try {
    plan = plan_infer(*model, request);
  } catch (...) {
    ++model->refused;
    throw;
  }
  KILN_BAD_REQUEST(plan.prompts.size() == 1,
                   "input '{}': ModelStreamInfer takes one prompt per request (shape [1] or "
                   "[1, 1]), this one has {}",
                   model->settings().input_name, plan.prompts.size());
  Generation g(model, TextRequest{plan.prompts[0], true, plan.params, 0, "grpc"});

  // Ids whose text is held back (a possible stop string) go out with the next text.
  std::vector<int64_t> pending_ids;
  auto write = [&](const std::string& text, bool final) {
    ModelStreamInferResponse out;
    auto& r = *out.mutable_infer_response();
    start_response(*model, request, r);
    if (plan.want_text) add_text_output(*model, plan, {text}, r);
    if (plan.want_ids) add_ids_output(plan, {pending_ids}, r);
    pending_ids.clear();
    set_final(r, final);
    return stream->Write(out);
  };
  return pump(g, context, [&](const ResponseChunk& c) {
    pending_ids.insert(pending_ids.end(), c.token_ids.begin(), c.token_ids.end());
    if (c.finished) {
      throw_if_failed(c);
      return write(c.text, true);
    }
    return c.text.empty() || write(c.text, false);
  });
}

}  // namespace

const std::vector<ParameterInput>& parameter_tensors() {
  static const std::vector<ParameterInput> inputs = {
      {"max_tokens", "INT32", false},    {"min_tokens", "INT32", false},
      {"temperature", "FP32", false},    {"top_k", "INT32", false},
      {"top_p", "FP32", false},          {"seed", "UINT64", false},
      {"beam_width", "INT32", false},    {"repetition_penalty", "FP32", false},
      {"length_penalty", "FP32", false}, {"ignore_eos", "BOOL", false},
      {"stop", "BYTES", true},           {"return_token_ids", "BOOL", false},
  };
  return inputs;
}

InferPlan plan_infer(const LoadedModel& model, const ModelInferRequest& request) {
  const ModelSettings& settings = model.settings();
  InferPlan plan;
  plan.raw = request.raw_input_contents_size() > 0;
  KILN_BAD_REQUEST(!plan.raw || request.raw_input_contents_size() == request.inputs_size(),
                   "raw_input_contents has {} entries for {} inputs (one per input, in order)",
                   request.raw_input_contents_size(), request.inputs_size());
  std::set<std::string> seen;
  std::vector<std::string> unknown;
  bool have_prompt = false;
  for (int i = 0; i < request.inputs_size(); ++i) {
    const auto& input = request.inputs(i);
    KILN_BAD_REQUEST(seen.insert(input.name()).second, "input '{}' is given twice", input.name());
    KILN_BAD_REQUEST(!plan.raw || !has_contents(input),
                     "input '{}' has contents while the request uses raw_input_contents (Triton "
                     "allows one or the other)",
                     input.name());
    const std::string* raw = plan.raw ? &request.raw_input_contents(i) : nullptr;
    if (input.name() == settings.input_name) {
      const auto& shape = input.shape();
      KILN_BAD_REQUEST(shape.size() == 1 || (shape.size() == 2 && shape[1] == 1),
                       "input '{}': shape {} is not [N] or [N, 1] (N prompts)", input.name(),
                       shape_text(shape));
      plan.prompts = bytes_elements(input, raw);
      KILN_BAD_REQUEST(!plan.prompts.empty(), "input '{}' holds no prompt (shape {})", input.name(),
                       shape_text(shape));
      const int64_t limit =
          settings.max_batch_size > 0 ? settings.max_batch_size : kMaxPromptsPerRequest;
      KILN_BAD_REQUEST(static_cast<int64_t>(plan.prompts.size()) <= limit,
                       "input '{}': {} prompts, at most {} per request", input.name(),
                       plan.prompts.size(), limit);
      plan.shape = shape;
      have_prompt = true;
      continue;
    }
    const auto& known = parameter_tensors();
    const bool is_parameter = std::any_of(known.begin(), known.end(),
                                          [&](const auto& p) { return input.name() == p.name; });
    if (!is_parameter) {
      std::vector<std::string> names = {settings.input_name};
      for (const auto& p : known) names.push_back(p.name);
      KILN_SERVER_FAIL(Code::kBadRequest, "unknown input '{}'; model '{}' takes {}", input.name(),
                       model.name(), join_names(names));
    }
    set_parameter(plan.params, input.name(), parameter_tensor_value(input, raw), unknown);
  }
  KILN_BAD_REQUEST(have_prompt, "the request has no input '{}' (BYTES, shape [1]: the prompt)",
                   settings.input_name);

  for (const auto& [key, value] : request.parameters()) {
    if (key == kEmptyFinalParameter) continue;
    KILN_BAD_REQUEST(seen.count(key) == 0,
                     "'{}' is given both as an input tensor and as a request parameter", key);
    set_parameter(plan.params, key, parameter_value(value), unknown);
  }
  if (!unknown.empty()) {
    std::sort(unknown.begin(), unknown.end());
    std::vector<std::string> names;
    for (const auto& p : parameter_tensors()) names.push_back(p.name);
    KILN_SERVER_FAIL(Code::kBadRequest, "unknown parameter{} {}; generation parameters are {}",
                     unknown.size() > 1 ? "s" : "", join_names(unknown), join_names(names));
  }

  plan.want_text = request.outputs_size() == 0;
  plan.want_ids = plan.params.return_token_ids;
  for (const auto& output : request.outputs()) {
    if (output.name() == settings.output_name) {
      plan.want_text = true;
    } else if (output.name() == kTokenIdsOutput) {
      plan.want_ids = true;
    } else {
      KILN_SERVER_FAIL(Code::kBadRequest, "unknown output '{}'; model '{}' has '{}' and '{}'",
                       output.name(), model.name(), settings.output_name, kTokenIdsOutput);
    }
  }
  return plan;
}

grpc::Status model_infer(ModelManager& models, grpc::ServerContext* context,
                         const ModelInferRequest& request, ModelInferResponse* response) {
  auto model = models.get(request.model_name(), request.model_version());
  InferPlan plan;
  try {
    plan = plan_infer(*model, request);
  } catch (...) {
    ++model->refused;
    throw;
  }
  // Every prompt is enqueued before any is read, so that a batch request runs as a batch.
  std::vector<std::unique_ptr<Generation>> generations;
  for (size_t i = 0; i < plan.prompts.size(); ++i)
    generations.push_back(std::make_unique<Generation>(
        model, TextRequest{plan.prompts[i], true, plan.params, static_cast<uint64_t>(i), "grpc"}));

  std::vector<Generated> results(generations.size());
  for (size_t i = 0; i < generations.size(); ++i) {
    Generated& r = results[i];
    const bool finished = pump(*generations[i], context, [&](const ResponseChunk& c) {
      r.text += c.text;
      r.ids.insert(r.ids.end(), c.token_ids.begin(), c.token_ids.end());
      if (c.finished) {
        throw_if_failed(c);
        r.finish_reason = c.finish_reason;
      }
      return true;
    });
    if (!finished) return {grpc::StatusCode::CANCELLED, "the client cancelled the call"};
  }

  start_response(*model, request, *response);
  std::vector<std::string> texts;
  std::vector<std::vector<int64_t>> ids;
  for (auto& r : results) {
    texts.push_back(std::move(r.text));
    ids.push_back(std::move(r.ids));
  }
  if (plan.want_text) add_text_output(*model, plan, texts, *response);
  if (plan.want_ids) add_ids_output(plan, ids, *response);
  if (results.size() == 1) {
    InferParameter reason;
    reason.set_string_param(finish_reason_name(results[0].finish_reason));
    (*response->mutable_parameters())["finish_reason"] = reason;
  }
  return grpc::Status::OK;
}

grpc::Status model_stream_infer(
    ModelManager& models, grpc::ServerContext* context,
    grpc::ServerReaderWriter<ModelStreamInferResponse, ModelInferRequest>* stream) {
  // Requests of one stream are served one after another: a stream's responses stay in request
  // order and a stream holds at most one generation (clients wanting several generations at
  // once open several streams or use ModelInfer).
  ModelInferRequest request;
  while (stream->Read(&request)) {
    try {
      if (!stream_one(models, context, request, stream))
        return {grpc::StatusCode::CANCELLED, "the client went away"};
    } catch (const std::exception& e) {
      // On a stream an error is a message, and the stream goes on with the next request. The
      // response names the request and is final, for clients that wait for the final flag.
      ModelStreamInferResponse out;
      out.set_error_message(to_server_error(e).what());
      auto& r = *out.mutable_infer_response();
      r.set_model_name(request.model_name());
      r.set_model_version(request.model_version());
      r.set_id(request.id());
      set_final(r, true);
      if (!stream->Write(out)) return {grpc::StatusCode::CANCELLED, "the client went away"};
    }
  }
  return grpc::Status::OK;
}

}  // namespace kiln::server
