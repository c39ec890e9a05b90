// The gRPC frontend: KServe v2 / Triton's inference.GRPCInferenceService (proto/
// grpc_service.proto) over the ModelManager, with gRPC's synchronous server API (one thread per
// call in flight; a streaming call keeps its thread while its stream is open).
//
// Text generation in tensor terms: the model's input (settings().input_name, BYTES, shape [N]
// or [N,1]: N prompts), optional parameter inputs named like the generation parameters, the
// output settings().output_name (BYTES, the input's shape) and, on request, "token_ids"
// (INT64 [N.., L], padded with -1 when the lengths of a batch differ). ModelStreamInfer is
// Triton's decoupled convention: one response per piece of text, the last one carrying the
// response parameter triton_final_response = true.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/logging.h"
#include "runtime/generation_executor.h"
#include "server/errors.h"
#include "server/model_manager.h"

namespace grpc {
class Server;
class Status;
}  // namespace grpc

namespace kiln::server {

struct GrpcOptions {
  std::string host = "127.0.0.1";
  int port = 8001;      // 0: any free port (port() says which)
  std::string api_key;  // non-empty: every RPC but ServerLive/ServerReady needs
                        // "authorization: Bearer <key>" metadata
  int64_t max_message_bytes = int64_t{64} << 20;  // largest request gRPC accepts
};

// The one place where a server error becomes a gRPC status.
grpc::Status grpc_status(const ServerError& e);

// The protocol extensions kiln's KServe endpoints support (ServerMetadata's list).
const std::vector<std::string>& kserve_extensions();

class GrpcFrontend {
 public:
  GrpcFrontend(ModelManager& models, GrpcOptions options, const Logger& log);
  ~GrpcFrontend();  // shuts down now if shutdown() was not called
  GrpcFrontend(const GrpcFrontend&) = delete;
  GrpcFrontend& operator=(const GrpcFrontend&) = delete;

  // Listens and starts serving; throws ServerError with the reason when the address cannot be
  // bound (port in use, bad host).
  void start();
  // The bound port (after start()).
  int port() const { return port_; }
  // Stops taking calls; calls in flight (open streams included) may finish until `deadline`,
  // then are cancelled, which cancels their generations.
  void shutdown(Clock::time_point deadline);

  class Service;  // the GRPCInferenceService implementation (grpc_frontend.cc)

 private:
  ModelManager& models_;
  GrpcOptions options_;
  const Logger& log_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace kiln::server
