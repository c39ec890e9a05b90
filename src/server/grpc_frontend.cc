#include "server/grpc_frontend.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <cstring>

#include <grpcpp/grpcpp.h>

#include "core/version.h"
#include "grpc_service.grpc.pb.h"
#include "server/grpc_infer.h"
#include "server/grpc_tensors.h"

namespace kiln::server {

grpc::Status grpc_status(const ServerError& e) {
  grpc::StatusCode code = grpc::StatusCode::INTERNAL;
  switch (e.code()) {
    case Code::kBadRequest:
    case Code::kTooLarge:
      code = grpc::StatusCode::INVALID_ARGUMENT;
      break;
    case Code::kUnauthorized:
      code = grpc::StatusCode::UNAUTHENTICATED;
      break;
    case Code::kNotFound:
      code = grpc::StatusCode::NOT_FOUND;
      break;
    case Code::kUnavailable:
      code = grpc::StatusCode::UNAVAILABLE;
      break;
    case Code::kQueueFull:
      code = grpc::StatusCode::RESOURCE_EXHAUSTED;
      break;
    case Code::kTimeout:
      code = grpc::StatusCode::DEADLINE_EXCEEDED;
      break;
    case Code::kInternal:
      code = grpc::StatusCode::INTERNAL;
      break;
  }
  return {code, e.what()};
}

const std::vector<std::string>& kserve_extensions() {
  static const std::vector<std::string> extensions = {
      "model_repository", "model_configuration", "schedule_policy", "binary_tensor_data",
      "parameters",       "statistics",          "generate"};
  return extensions;
}

namespace {

using namespace inference;

std::string host_port(const std::string& host, int port) {
  const bool ipv6 = host.find(':') != std::string::npos && host.front() != '[';
  return (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

// gRPC only says that it could not listen; binding a socket ourselves gives the reason
// ("Address already in use", a host that does not resolve).
std::string bind_failure_reason(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  addrinfo* found = nullptr;
  const std::string service = std::to_string(port);
  if (int rc = getaddrinfo(host.c_str(), service.c_str(), &hints, &found); rc != 0)
    return fmt::format("host '{}' does not resolve: {}", host, gai_strerror(rc));
  std::string reason = "gRPC could not start a server there";
  for (addrinfo* a = found; a != nullptr; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
    if (fd < 0) continue;
    if (bind(fd, a->ai_addr, a->ai_addrlen) != 0) reason = std::strerror(errno);
    close(fd);
  }
  freeaddrinfo(found);
  return reason;
}

uint64_t ms_since_epoch(Clock::time_point t) {
  if (t == Clock::time_point{}) return 0;  // never
  const auto age =
      std::chrono::duration_cast<std::chrono::system_clock::duration>(Clock::now() - t);
  const auto when = std::chrono::system_clock::now() - age;
  return static_cast<uint64_t>(
      std::chrono::duration_cast<std::chrono::milliseconds>(when.time_since_epoch()).count());
}

void set_duration(StatisticDuration* d, int64_t count, int64_t us) {
  d->set_count(static_cast<uint64_t>(std::max<int64_t>(count, 0)));
  d->set_ns(static_cast<uint64_t>(std::max<int64_t>(us, 0)) * 1000);
}

// Triton's statistics from the executors' counters. The executors total the queue, compute and
// request times over all finished requests, so `success` carries the total of every finished
// request; failures (errors, timeouts, cancellations, refusals) are counted without a duration.
void fill_statistics(const LoadedModel& model, ModelStatistics* out) {
  const ExecutorStats s = model.stats();
  out->set_name(model.name());
  out->set_version(std::to_string(model.version()));
  out->set_last_inference(ms_since_epoch(s.last_request));
  out->set_inference_count(static_cast<uint64_t>(s.success));
  out->set_execution_count(static_cast<uint64_t>(s.steps));
  auto* infer = out->mutable_inference_stats();
  set_duration(infer->mutable_success(), s.success, s.request_us);
  set_duration(infer->mutable_fail(), model.failed(s), 0);
  set_duration(infer->mutable_queue(), s.success, s.queue_us);
  set_duration(infer->mutable_compute_infer(), s.success, s.compute_us);
  // Input and output preparation are part of the engine step in kiln; counted, not timed, so
  // that clients dividing by the count see zero rather than a division by zero.
  set_duration(infer->mutable_compute_input(), s.success, 0);
  set_duration(infer->mutable_compute_output(), s.success, 0);
}

void add_tensor(google::protobuf::RepeatedPtrField<ModelMetadataResponse::TensorMetadata>* list,
                const std::string& name, const std::string& datatype,
                std::initializer_list<int64_t> shape) {
  auto* t = list->Add();
  t->set_name(name);
  t->set_datatype(datatype);
  for (int64_t d : shape) t->add_shape(d);
}

// Whether `key` equals the API key, in time independent of where they differ.
bool same_key(std::string_view given, const std::string& key) {
  unsigned char diff = given.size() == key.size() ? 0 : 1;
  for (size_t i = 0; i < key.size(); ++i)
    diff |= static_cast<unsigned char>(key[i] ^ (i < given.size() ? given[i] : 0));
  return diff == 0;
}

}  // namespace

class GrpcFrontend::Service final : public GRPCInferenceService::Service {
 public:
  Service(ModelManager& models, const GrpcOptions& options, const Logger& log)
      : models_(models), options_(options), log_(log) {}

  grpc::Status ServerLive(grpc::ServerContext* ctx, const ServerLiveRequest*,
                          ServerLiveResponse* out) override {
    return run(ctx, "ServerLive", false, [&] { out->set_live(true); });
  }

  grpc::Status ServerReady(grpc::ServerContext* ctx, const ServerReadyRequest*,
                           ServerReadyResponse* out) override {
    return run(ctx, "ServerReady", false, [&] { out->set_ready(models_.all_ready()); });
  }

  // Triton answers ready=false, not an error, for a model it does not know.
  grpc::Status ModelReady(grpc::ServerContext* ctx, const ModelReadyRequest* in,
                          ModelReadyResponse* out) override {
    return run(ctx, "ModelReady", true, [&] {
      try {
        models_.get(in->name(), in->version());
        out->set_ready(true);
      } catch (const ServerError& e) {
        if (e.code() != Code::kNotFound && e.code() != Code::kUnavailable) throw;
        out->set_ready(false);
      }
    });
  }

  grpc::Status ServerMetadata(grpc::ServerContext* ctx, const ServerMetadataRequest*,
                              ServerMetadataResponse* out) override {
    return run(ctx, "ServerMetadata", true, [&] {
      out->set_name("kiln");
      out->set_version(version_string());
      for (const auto& e : kserve_extensions()) out->add_extensions(e);
    });
  }

  grpc::Status ModelMetadata(grpc::ServerContext* ctx, const ModelMetadataRequest* in,
                             ModelMetadataResponse* out) override {
    return run(ctx, "ModelMetadata", true, [&] {
      auto model = models_.get(in->name(), in->version());
      const ModelSettings& s = model->settings();
      out->set_name(model->name());
      // Without a version: every ready version of the model, as Triton lists them.
      if (in->version().empty()) {
        for (const auto& e : models_.index(true))
          if (e.name == model->name() && !e.version.empty()) out->add_versions(e.version);
      }
      if (out->versions_size() == 0) out->add_versions(std::to_string(model->version()));
      out->set_platform(!s.config.platform().empty()  ? s.config.platform()
                        : !s.config.backend().empty() ? s.config.backend()
                                                      : "kiln");
      add_tensor(out->mutable_inputs(), s.input_name, "BYTES", {-1});
      for (const auto& p : parameter_tensors())
        add_tensor(out->mutable_inputs(), p.name, p.datatype, {p.many ? -1 : 1});
      add_tensor(out->mutable_outputs(), s.output_name, "BYTES", {-1});
      add_tensor(out->mutable_outputs(), kTokenIdsOutput, "INT64", {-1, -1});
    });
  }

  grpc::Status ModelInfer(grpc::ServerContext* ctx, const ModelInferRequest* in,
                          ModelInferResponse* out) override {
    return run(ctx, "ModelInfer", true, [&] { return model_infer(models_, ctx, *in, out); });
  }

  grpc::Status ModelStreamInfer(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<ModelStreamInferResponse, ModelInferRequest>* stream) override {
    return run(ctx, "ModelStreamInfer", true,
               [&] { return model_stream_infer(models_, ctx, stream); });
  }

  grpc::Status ModelConfig(grpc::ServerContext* ctx, const ModelConfigRequest* in,
                           ModelConfigResponse* out) override {
    return run(ctx, "ModelConfig", true, [&] {
      *out->mutable_config() = models_.get(in->name(), in->version())->settings().config;
    });
  }

  grpc::Status ModelStatistics(grpc::ServerContext* ctx, const ModelStatisticsRequest* in,
                               ModelStatisticsResponse* out) override {
    return run(ctx, "ModelStatistics", true, [&] {
      std::vector<std::shared_ptr<LoadedModel>> chosen;
      if (in->name().empty() || in->version().empty()) {
        for (auto& m : models_.ready_models())
          if (in->name().empty() || m->name() == in->name()) chosen.push_back(m);
      }
      // A named model with no ready version (or a named version): get() says why.
      if (chosen.empty() && !in->name().empty())
        chosen.push_back(models_.get(in->name(), in->version()));
      for (const auto& m : chosen) fill_statistics(*m, out->add_model_stats());
    });
  }

  grpc::Status RepositoryIndex(grpc::ServerContext* ctx, const RepositoryIndexRequest* in,
                               RepositoryIndexResponse* out) override {
    return run(ctx, "RepositoryIndex", true, [&] {
      for (const auto& e : models_.index(in->ready())) {
        auto* m = out->add_models();
        m->set_name(e.name);
        m->set_version(e.version);
        m->set_state(state_name(e.state));
        m->set_reason(e.reason);
      }
    });
  }

  grpc::Status RepositoryModelLoad(grpc::ServerContext* ctx, const RepositoryModelLoadRequest* in,
                                   RepositoryModelLoadResponse*) override {
    return run(ctx, "RepositoryModelLoad", true, [&] {
      check_explicit_control();
      // Triton's load parameters override the config or ship model files; kiln loads what is
      // in the repository only.
      for (const auto& [key, value] : in->parameters()) {
        KILN_SERVER_FAIL(Code::kBadRequest,
                         "load parameter '{}' is not supported: kiln loads the model as it is "
                         "in the repository",
                         key);
      }
      models_.load(in->model_name());
    });
  }

  grpc::Status RepositoryModelUnload(grpc::ServerContext* ctx,
                                     const RepositoryModelUnloadRequest* in,
                                     RepositoryModelUnloadResponse*) override {
    return run(ctx, "RepositoryModelUnload", true, [&] {
      check_explicit_control();
      for (const auto& [key, value] : in->parameters()) {
        // Ensembles have dependents; kiln has none, so the flag changes nothing.
        KILN_BAD_REQUEST(key == "unload_dependents",
                         "unknown unload parameter '{}' (kiln knows 'unload_dependents')", key);
      }
      models_.unload(in->model_name());
    });
  }

 private:
  void check_explicit_control() const {
    // Triton's answer when model control is not explicit.
    if (!models_.explicit_control())
      KILN_SERVER_FAIL(Code::kUnavailable,
                       "explicit model load / unload is not allowed: the server was not started "
                       "in explicit model control mode");
  }

  void check_key(grpc::ServerContext* ctx) const {
    if (options_.api_key.empty()) return;
    const auto& metadata = ctx->client_metadata();
    auto it = metadata.find("authorization");
    const std::string_view prefix = "Bearer ";
    if (it != metadata.end()) {
      const std::string_view value(it->second.data(), it->second.size());
      if (value.substr(0, prefix.size()) == prefix &&
          same_key(value.substr(prefix.size()), options_.api_key))
        return;
    }
    KILN_SERVER_FAIL(Code::kUnauthorized,
                     "this server needs an API key: metadata 'authorization: Bearer <key>'");
  }

  // Runs one RPC's body: the API key check, then the body; every exception becomes the
  // status of its ServerError code (an exception must not leave a gRPC handler).
  template <typename Body>
  grpc::Status run(grpc::ServerContext* ctx, const char* rpc, bool needs_key, Body&& body) {
    try {
      if (needs_key) check_key(ctx);
      if constexpr (std::is_same_v<decltype(body()), grpc::Status>) {
        return body();
      } else {
        body();
        return grpc::Status::OK;
      }
    } catch (const std::exception& e) {
      const ServerError error = to_server_error(e);
      if (error.code() == Code::kInternal) {
        log_.warn("gRPC {} ({}): {}", rpc, ctx->peer(), error.what());
      } else {
        log_.debug("gRPC {} ({}): {}", rpc, ctx->peer(), error.what());
      }
      return grpc_status(error);
    } catch (...) {
      log_.warn("gRPC {} ({}): unknown exception", rpc, ctx->peer());
      return {grpc::StatusCode::INTERNAL, "internal error"};
    }
  }

  ModelManager& models_;
  const GrpcOptions options_;
  const Logger& log_;
};

GrpcFrontend::GrpcFrontend(ModelManager& models, GrpcOptions options, const Logger& log)
    : models_(models), options_(std::move(options)), log_(log) {}

GrpcFrontend::~GrpcFrontend() { shutdown(Clock::now()); }

void GrpcFrontend::start() {
  KILN_CHECK(server_ == nullptr, "the gRPC frontend is already started");
  service_ = std::make_unique<Service>(models_, options_, log_);
  const std::string address = host_port(options_.host, options_.port);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &port_);
  // gRPC sets SO_REUSEPORT by default, so a second server on a port in use would start and
  // share it silently; kiln wants "port in use" instead.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  builder.SetMaxReceiveMessageSize(
      static_cast<int>(std::clamp<int64_t>(options_.max_message_bytes, 1, INT_MAX)));
  builder.RegisterService(service_.get());
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) {
    server_.reset();
    service_.reset();
    KILN_SERVER_FAIL(Code::kUnavailable, "gRPC: cannot listen on {}: {}", address,
                     bind_failure_reason(options_.host, options_.port));
  }
  log_.info("gRPC (KServe v2, inference.GRPCInferenceService) listening on {}",
            host_port(options_.host, port_));
}

void GrpcFrontend::shutdown(Clock::time_point deadline) {
  if (server_ == nullptr) return;
  if (deadline == Clock::time_point::max()) {
    server_->Shutdown();
  } else {
    const auto left = std::max(Clock::duration::zero(), deadline - Clock::now());
    server_->Shutdown(std::chrono::system_clock::now() +
                      std::chrono::duration_cast<std::chrono::system_clock::duration>(left));
  }
  server_->Wait();
  server_.reset();
  service_.reset();
}

}  // namespace kiln::server
