// kiln perf over KServe v2 gRPC (inference.GRPCInferenceService): ModelInfer for a request
// answered in one piece, ModelStreamInfer (one bidirectional stream per request: the request
// written, the stream half-closed, responses read until the server ends it) when streamed.
#include <grpcpp/grpcpp.h>

#include <cstring>

#include "core/status.h"
#include "grpc_service.grpc.pb.h"
#include "perf_client.h"

namespace kiln::cli::perf {

struct GrpcChannel {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<inference::GRPCInferenceService::Stub> stub;
};

void GrpcChannelDeleter::operator()(GrpcChannel* c) const { delete c; }

std::unique_ptr<GrpcChannel, GrpcChannelDeleter> open_grpc(const Target& t) {
  KILN_CHECK_USAGE(t.base_path.empty(),
                   "--url {}{}: gRPC takes HOST:PORT (no path after it), e.g. localhost:8001",
                   t.scheme_host_port, t.base_path);
  const size_t sep = t.scheme_host_port.find("://");
  const std::string host_port = t.scheme_host_port.substr(sep + 3);
  const bool tls = t.scheme_host_port.starts_with("https://");
  std::unique_ptr<GrpcChannel, GrpcChannelDeleter> c(new GrpcChannel);
  c->channel = grpc::CreateChannel(
      host_port, tls ? grpc::SslCredentials({}) : grpc::InsecureChannelCredentials());
  c->stub = inference::GRPCInferenceService::NewStub(c->channel);
  return c;
}

namespace {

std::string shorten(const std::string& s, size_t n = 300) {
  return s.size() <= n ? s : s.substr(0, n) + "...";
}

void set_param(google::protobuf::Map<std::string, inference::InferParameter>& params,
               const std::string& name, const auto& value) {
  inference::InferParameter& p = params[name];
  using V = std::decay_t<decltype(value)>;
  if constexpr (std::is_same_v<V, bool>)
    p.set_bool_param(value);
  else if constexpr (std::is_integral_v<V>)
    p.set_int64_param(value);
  else
    p.set_double_param(value);
}

inference::ModelInferRequest make_request(const Target& t, const std::string& prompt) {
  inference::ModelInferRequest req;
  req.set_model_name(t.model);
  auto& params = *req.mutable_parameters();
  set_param(params, "max_tokens", t.output_len);
  set_param(params, "temperature", t.temperature);
  set_param(params, "return_token_ids", true);
  if (t.ignore_eos) set_param(params, "ignore_eos", true);
  inference::ModelInferRequest::InferInputTensor* in = req.add_inputs();
  in->set_name("text_input");
  in->set_datatype("BYTES");
  in->add_shape(1);
  in->mutable_contents()->add_bytes_contents(prompt);
  return req;
}

// What one response carried: its text (the "text_output" tensor, else the first BYTES one) and
// how many token ids ("token_ids"/"output_ids", when the server sends them); an error otherwise.
struct Output {
  std::string text;
  std::optional<int64_t> token_ids;
  bool final = false;  // Triton's "triton_final_response" parameter
  std::string error;
};

// The first element of a BYTES tensor in raw form: a 4-byte little-endian length, then the bytes.
std::optional<std::string> first_raw_element(const std::string& raw) {
  if (raw.size() < 4) return std::nullopt;
  uint32_t n = 0;
  for (int i = 3; i >= 0; --i) n = (n << 8) | static_cast<unsigned char>(raw[i]);
  if (n > raw.size() - 4) return std::nullopt;
  return raw.substr(4, n);
}

Output read_response(const inference::ModelInferResponse& res) {
  Output out;
  const auto final = res.parameters().find("triton_final_response");
  out.final = final != res.parameters().end() && final->second.bool_param();
  const inference::ModelInferResponse::InferOutputTensor* text = nullptr;
  int text_index = -1;
  for (int i = 0; i < res.outputs_size(); ++i) {
    const auto& o = res.outputs(i);
    const std::string* raw =
        i < res.raw_output_contents_size() ? &res.raw_output_contents(i) : nullptr;
    if (o.name() == "token_ids" || o.name() == "output_ids") {
      const auto& c = o.contents();
      int64_t n = c.int64_contents_size() + c.int_contents_size() + c.uint64_contents_size() +
                  c.uint_contents_size();
      if (raw != nullptr && n == 0)
        n = static_cast<int64_t>(raw->size()) / (o.datatype().ends_with("64") ? 8 : 4);
      out.token_ids = n;
    } else if (o.datatype() == "BYTES" && (text == nullptr || o.name() == "text_output")) {
      text = &o;
      text_index = i;
    }
  }
  if (text == nullptr) {
    if (!out.token_ids && !out.final)
      out.error =
          "a response without a BYTES output (text_output): " + shorten(res.ShortDebugString());
    return out;
  }
  if (text->contents().bytes_contents_size() > 0) {
    out.text = text->contents().bytes_contents(0);
  } else if (text_index < res.raw_output_contents_size()) {
    const std::optional<std::string> e = first_raw_element(res.raw_output_contents(text_index));
    if (!e) out.error = "output \"" + text->name() + "\": raw BYTES data cut short";
    out.text = e.value_or("");
  }
  return out;
}

std::string status_error(const grpc::Status& s) {
  static const char* kNames[] = {"OK",
                                 "CANCELLED",
                                 "UNKNOWN",
                                 "INVALID_ARGUMENT",
                                 "DEADLINE_EXCEEDED",
                                 "NOT_FOUND",
                                 "ALREADY_EXISTS",
                                 "PERMISSION_DENIED",
                                 "RESOURCE_EXHAUSTED",
                                 "FAILED_PRECONDITION",
                                 "ABORTED",
                                 "OUT_OF_RANGE",
                                 "UNIMPLEMENTED",
                                 "INTERNAL",
                                 "UNAVAILABLE",
                                 "DATA_LOSS",
                                 "UNAUTHENTICATED"};
  const int code = s.error_code();
  const std::string name =
      code >= 0 && code < static_cast<int>(std::size(kNames)) ? kNames[code] : std::to_string(code);
  return fmt::format("gRPC {}: {}", name, s.error_message());
}

// UNAVAILABLE is also what a server answers for a model that is not ready: only a channel that
// never connected means the server is not there.
bool unreachable(Connection& c, const grpc::Status& s) {
  return s.error_code() == grpc::StatusCode::UNAVAILABLE &&
         c.grpc().channel->GetState(false) != GRPC_CHANNEL_READY;
}

}  // namespace

RequestResult run_grpc(Connection& c, const Target& t, const std::string& prompt,
                       Clock::time_point deadline) {
  RequestResult r;
  grpc::ClientContext ctx;
  if (!t.api_key.empty()) ctx.AddMetadata("authorization", "Bearer " + t.api_key);
  r.sent = Clock::now();
  // The whole call within --timeout, and (like the HTTP clients) no more than a second past the
  // end of the window.
  double limit_s = t.timeout_s;
  if (deadline != Clock::time_point::max())
    limit_s = std::min(limit_s, std::chrono::duration<double>(deadline - r.sent).count() + 1.0);
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::microseconds(static_cast<int64_t>(std::max(limit_s, 0.001) * 1e6)));
  const inference::ModelInferRequest req = make_request(t, prompt);
  inference::GRPCInferenceService::Stub& stub = *c.grpc().stub;

  if (!t.stream) {
    inference::ModelInferResponse res;
    const grpc::Status s = stub.ModelInfer(&ctx, req, &res);
    r.done = Clock::now();
    if (!s.ok()) {
      r.error = status_error(s);
      r.unreachable = unreachable(c, s);
      return r;
    }
    const Output o = read_response(res);
    if (!o.error.empty()) {
      r.error = o.error;
      return r;
    }
    r.tokens_counted_by_server = o.token_ids.has_value();
    r.output_tokens = o.token_ids.value_or(t.output_len);
    return r;
  }

  const auto stream = stub.ModelStreamInfer(&ctx);
  stream->Write(req);
  stream->WritesDone();
  inference::ModelStreamInferResponse res;
  int64_t responses = 0, output_events = 0;
  std::optional<int64_t> counted;
  bool cancelled = false, finished = false;
  while (stream->Read(&res)) {
    const Clock::time_point arrived = Clock::now();
    ++responses;
    if (arrived > deadline) {
      r.error = "abandoned at the end of the measurement window";
      break;
    }
    if (!res.error_message().empty()) {
      r.error = "the server said: " + res.error_message();
      break;
    }
    const Output o = read_response(res.infer_response());
    if (!o.error.empty()) {
      r.error = o.error;
      break;
    }
    if (o.token_ids) counted = counted.value_or(0) + *o.token_ids;
    if (!o.text.empty() || o.token_ids.value_or(0) > 0) {
      ++output_events;
      if (!r.first_token) r.first_token = arrived;
      r.last_token = arrived;
    }
    if (o.final) {
      finished = true;
      break;
    }
  }
  if (!r.error.empty() || finished) {
    // Nothing more is wanted from this call: end it now rather than wait for the server.
    ctx.TryCancel();
    cancelled = true;
  }
  const grpc::Status s = stream->Finish();
  r.done = Clock::now();
  if (!r.error.empty()) return r;
  if (!s.ok() && !(cancelled && s.error_code() == grpc::StatusCode::CANCELLED)) {
    r.error = status_error(s);
    r.unreachable = responses == 0 && unreachable(c, s);
    return r;
  }
  if (output_events == 0 && counted.value_or(0) == 0) {
    r.error = "the stream carried no output";
    return r;
  }
  r.tokens_counted_by_server = counted.has_value();
  r.output_tokens = counted.value_or(output_events);
  return r;
}

}  // namespace kiln::cli::perf
