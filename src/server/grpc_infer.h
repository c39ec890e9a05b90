// ModelInfer and ModelStreamInfer of the gRPC frontend: a ModelInferRequest read into prompts
// and generation parameters, the generations run (cancelled when the client goes away), and
// their text written back as tensors. Internal to grpc_frontend.cc.
#pragma once

#include <string>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/support/sync_stream.h>

#include "grpc_service.grpc.pb.h"
#include "server/errors.h"  // before generation_service.h, which uses ServerError
#include "server/generation_service.h"
#include "server/model_manager.h"

namespace kiln::server {

// The optional inputs that carry a generation parameter (named like it) and their datatype as
// ModelMetadata states it; any integer, float or BOOL datatype is accepted on input.
struct ParameterInput {
  const char* name;
  const char* datatype;
  bool many;  // shape [-1] (stop strings), else [1]
};
const std::vector<ParameterInput>& parameter_tensors();

// The extra output with the generated ids (INT64 [N, L]).
inline constexpr const char* kTokenIdsOutput = "token_ids";

// A ModelInferRequest read for generation.
struct InferPlan {
  std::vector<std::string> prompts;
  google::protobuf::RepeatedField<int64_t> shape;  // the prompt input's: [N] or [N, 1]
  RequestParams params;
  bool raw = false;  // the request used raw_input_contents: answer with raw_output_contents
  bool want_text = true;
  bool want_ids = false;
};

// Throws a kBadRequest ServerError naming the input, output or parameter at fault.
InferPlan plan_infer(const LoadedModel& model, const inference::ModelInferRequest& request);

grpc::Status model_infer(ModelManager& models, grpc::ServerContext* context,
                         const inference::ModelInferRequest& request,
                         inference::ModelInferResponse* response);

grpc::Status model_stream_infer(ModelManager& models, grpc::ServerContext* context,
                                grpc::ServerReaderWriter<inference::ModelStreamInferResponse,
                                                         inference::ModelInferRequest>* stream);

}  // namespace kiln::server
