// The gRPC frontend in-process over a repository holding the micro BLOOM plan, called through
// grpc++'s generated client: binding, the API key, tensor encodings, streams, and bytes that are
// not a protobuf (BadInput*: under ASan in `make asan`). The protocol as Triton's clients see it
// is tested by tests/server/grpc.test.mjs (grpc-js); GrpcFrontend.NodeClients runs it against
// this process' server when tests/server/node_modules is installed.
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "grpc_service.grpc.pb.h"
#include "server/grpc_frontend.h"
#include "server/grpc_tensors.h"
#include "server/model_manager.h"

namespace kiln::server {
namespace {

namespace fs = std::filesystem;
using namespace inference;

constexpr const char* kModel = "micro";

std::string plan_path() {
  return std::string(KILN_SOURCE_DIR) + "/tests/data/plans/v3/micro-bloom.plan";
}

// One model repository and manager for the suite (loading is the slow part).
class GrpcFrontendTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    repo_ = fs::path(KILN_TEST_TMP) / ("grpc_repo_" + std::to_string(::getpid()));
    fs::remove_all(repo_);
    fs::create_directories(repo_ / kModel / "1");
    fs::copy_file(plan_path(), repo_ / kModel / "1" / "model.plan");
    std::ofstream(repo_ / kModel / "config.pbtxt")
        << "name: \"micro\"\nbackend: \"kiln\"\nmax_batch_size: 4\n";
    ManagerOptions options;
    options.repository = repo_.string();
    options.explicit_control = true;
    options.threads = 1;
    options.log_level = LogLevel::kError;
    manager_ = new ModelManager(options, log_);
    manager_->load(kModel);
    manager_->startup_done();
  }
  static void TearDownTestSuite() {
    delete manager_;
    fs::remove_all(repo_);
  }

  std::unique_ptr<GrpcFrontend> start(std::string api_key = "") {
    auto f = std::make_unique<GrpcFrontend>(*manager_,
                                            GrpcOptions{"127.0.0.1", 0, api_key, 1 << 20}, log_);
    f->start();
    return f;
  }
  static std::unique_ptr<GRPCInferenceService::Stub> stub(const GrpcFrontend& f) {
    return GRPCInferenceService::NewStub(grpc::CreateChannel(
        "127.0.0.1:" + std::to_string(f.port()), grpc::InsecureChannelCredentials()));
  }
  static ModelInferRequest prompt_request(const std::vector<std::string>& prompts, bool raw) {
    ModelInferRequest r;
    r.set_model_name(kModel);
    r.set_id("req-1");
    auto* in = r.add_inputs();
    in->set_name("text_input");
    in->set_datatype("BYTES");
    in->add_shape(static_cast<int64_t>(prompts.size()));
    in->add_shape(1);
    if (raw) {
      r.add_raw_input_contents(encode_raw_bytes(prompts));
    } else {
      for (const auto& p : prompts) in->mutable_contents()->add_bytes_contents(p);
    }
    InferParameter max_tokens;
    max_tokens.set_int64_param(6);
    (*r.mutable_parameters())["max_tokens"] = max_tokens;
    return r;
  }

  static inline Logger log_{LogLevel::kError};
  static inline fs::path repo_;
  static inline ModelManager* manager_ = nullptr;
};

TEST_F(GrpcFrontendTest, PortInUseIsRefusedWithTheReason) {
  auto first = start();
  GrpcFrontend second(*manager_, GrpcOptions{"127.0.0.1", first->port(), "", 1 << 20}, log_);
  try {
    second.start();
    FAIL() << "a second server started on port " << first->port();
  } catch (const ServerError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(std::to_string(first->port())), std::string::npos) << msg;
    EXPECT_NE(msg.find("in use"), std::string::npos) << msg;
  }
}

TEST_F(GrpcFrontendTest, ApiKeyIsNeededExceptForHealth) {
  auto f = start("s3cret");
  auto client = stub(*f);
  {
    grpc::ClientContext ctx;
    ServerLiveResponse live;
    ASSERT_TRUE(client->ServerLive(&ctx, {}, &live).ok());
    EXPECT_TRUE(live.live());
  }
  for (const char* header : {"", "Bearer wrong", "s3cret", "Bearer s3cre", "Bearer s3cret!"}) {
    grpc::ClientContext ctx;
    if (*header) ctx.AddMetadata("authorization", header);
    ServerMetadataResponse meta;
    EXPECT_EQ(client->ServerMetadata(&ctx, {}, &meta).error_code(),
              grpc::StatusCode::UNAUTHENTICATED)
        << header;
  }
  grpc::ClientContext ctx;
  ctx.AddMetadata("authorization", "Bearer s3cret");
  ServerMetadataResponse meta;
  ASSERT_TRUE(client->ServerMetadata(&ctx, {}, &meta).ok());
  EXPECT_EQ(meta.name(), "kiln");
}

// The ports listen while the models given at start load: the server is live at once and ready
// only once those loads are over (kiln serve calls startup_done after them).
TEST_F(GrpcFrontendTest, ReadyOnlyAfterTheStartupLoads) {
  ModelManager loading(ManagerOptions{}, log_);
  GrpcFrontend f(loading, GrpcOptions{"127.0.0.1", 0, "", 1 << 20}, log_);
  f.start();
  auto client = stub(f);
  auto ready = [&] {
    grpc::ClientContext ctx;
    ServerReadyResponse r;
    EXPECT_TRUE(client->ServerReady(&ctx, {}, &r).ok());
    return r.ready();
  };
  grpc::ClientContext ctx;
  ServerLiveResponse live;
  ASSERT_TRUE(client->ServerLive(&ctx, {}, &live).ok());
  EXPECT_TRUE(live.live());
  EXPECT_FALSE(ready());
  loading.startup_done();
  EXPECT_TRUE(ready());
}

// Triton's rule: raw_input_contents in, raw_output_contents out; contents in, contents out. The
// text and the shape are the same either way, and a batch of N prompts gives N texts.
TEST_F(GrpcFrontendTest, RawAndTypedContentsAnswerInKind) {
  auto f = start();
  auto client = stub(*f);
  const std::vector<std::string> prompts = {"hello world", "abc"};
  ModelInferResponse typed, raw;
  {
    grpc::ClientContext ctx;
    auto status = client->ModelInfer(&ctx, prompt_request(prompts, false), &typed);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  {
    grpc::ClientContext ctx;
    auto status = client->ModelInfer(&ctx, prompt_request(prompts, true), &raw);
    ASSERT_TRUE(status.ok()) << status.error_message();
  }
  ASSERT_EQ(typed.outputs_size(), 1);
  EXPECT_EQ(typed.id(), "req-1");
  EXPECT_EQ(typed.model_version(), "1");
  EXPECT_EQ(typed.raw_output_contents_size(), 0);
  EXPECT_EQ(typed.outputs(0).name(), "text_output");
  EXPECT_EQ(typed.outputs(0).datatype(), "BYTES");
  EXPECT_EQ(std::vector<int64_t>(typed.outputs(0).shape().begin(), typed.outputs(0).shape().end()),
            (std::vector<int64_t>{2, 1}));
  const auto& texts = typed.outputs(0).contents().bytes_contents();
  ASSERT_EQ(texts.size(), 2);
  EXPECT_FALSE(texts[0].empty());

  ASSERT_EQ(raw.outputs_size(), 1);
  ASSERT_EQ(raw.raw_output_contents_size(), 1);
  EXPECT_EQ(raw.outputs(0).contents().bytes_contents_size(), 0);
  EXPECT_EQ(decode_raw_bytes(raw.raw_output_contents(0), 2, "text_output"),
            std::vector<std::string>(texts.begin(), texts.end()));
}

// The stream's text pieces concatenate to ModelInfer's text; only the last is final.
TEST_F(GrpcFrontendTest, StreamPiecesConcatenateToTheWholeText) {
  auto f = start();
  auto client = stub(*f);
  ModelInferResponse whole;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(client->ModelInfer(&ctx, prompt_request({"hello world"}, false), &whole).ok());
  }
  grpc::ClientContext ctx;
  auto stream = client->ModelStreamInfer(&ctx);
  ASSERT_TRUE(stream->Write(prompt_request({"hello world"}, false)));
  std::string text;
  int responses = 0;
  ModelStreamInferResponse r;
  while (stream->Read(&r)) {
    ASSERT_EQ(r.error_message(), "");
    ++responses;
    const auto& out = r.infer_response();
    if (out.outputs_size() == 1) text += out.outputs(0).contents().bytes_contents(0);
    const bool final = out.parameters().at("triton_final_response").bool_param();
    if (final) break;
  }
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_GE(responses, 2);
  EXPECT_EQ(text, whole.outputs(0).contents().bytes_contents(0));
}

TEST_F(GrpcFrontendTest, BadInputErrorsNameWhatIsWrong) {
  auto f = start();
  auto client = stub(*f);
  auto expect = [&](ModelInferRequest r, grpc::StatusCode code, const std::string& needle) {
    grpc::ClientContext ctx;
    ModelInferResponse out;
    const grpc::Status s = client->ModelInfer(&ctx, r, &out);
    EXPECT_EQ(s.error_code(), code) << s.error_message();
    EXPECT_NE(s.error_message().find(needle), std::string::npos) << s.error_message();
  };
  auto r = prompt_request({"hi"}, true);
  r.set_raw_input_contents(0, std::string("\x10\0\0\0hi", 6));
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "text_input");
  r = prompt_request({"hi"}, false);
  (*r.mutable_parameters())["bogus"].set_bool_param(true);
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "bogus");
  r = prompt_request({"hi"}, false);
  (*r.mutable_parameters())["temperature"].set_double_param(-1);
  expect(r, grpc::StatusCode::INVALID_ARGUMENT, "temperature");
  r = prompt_request({"hi"}, false);
  r.set_model_name("nope");
  expect(r, grpc::StatusCode::NOT_FOUND, "nope");
}

// Bytes that do not parse as a ModelInferRequest are refused by gRPC before kiln sees them; the
// server goes on answering.
TEST_F(GrpcFrontendTest, BadInputGarbageProtobufIsRefusedAndTheServerLives) {
  auto f = start();
  auto channel = grpc::CreateChannel("127.0.0.1:" + std::to_string(f->port()),
                                     grpc::InsecureChannelCredentials());
  grpc::GenericStub generic(channel);
  for (const std::string& garbage :
       {std::string(12, '\xff'), std::string("\x0a\x64", 2), std::string("\x2a\x05\x0a", 3)}) {
    grpc::ClientContext ctx;
    grpc::CompletionQueue cq;
    grpc::Slice slice(garbage);
    grpc::ByteBuffer request(&slice, 1), response;
    auto call =
        generic.PrepareUnaryCall(&ctx, "/inference.GRPCInferenceService/ModelInfer", request, &cq);
    call->StartCall();
    grpc::Status status;
    call->Finish(&response, &status, reinterpret_cast<void*>(1));
    void* tag = nullptr;
    bool ok = false;
    ASSERT_TRUE(cq.Next(&tag, &ok));
    EXPECT_FALSE(status.ok());
  }
  grpc::ClientContext ctx;
  ServerLiveResponse live;
  ASSERT_TRUE(stub(*f)->ServerLive(&ctx, {}, &live).ok());
  EXPECT_TRUE(live.live());
}

// Requests cancelled: a stream whose client cancels after the first piece and a ModelInfer
// whose deadline passes end their generations (8192 tokens: about 2 s of work on this plan on
// a 2-core machine) within a poll interval and a step instead of running to max_tokens.
ModelInferRequest long_request() {
  ModelInferRequest r;
  r.set_model_name(kModel);
  auto* in = r.add_inputs();
  in->set_name("text_input");
  in->set_datatype("BYTES");
  in->add_shape(1);
  in->mutable_contents()->add_bytes_contents("hello");
  (*r.mutable_parameters())["max_tokens"].set_int64_param(8192);
  (*r.mutable_parameters())["ignore_eos"].set_bool_param(true);
  return r;
}

bool cancelled_within(ModelManager& models, int64_t before, std::chrono::milliseconds limit) {
  const auto until = Clock::now() + limit;
  while (Clock::now() < until) {
    if (models.get(kModel)->stats().cancelled > before) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return false;
}

TEST_F(GrpcFrontendTest, ClientsThatGoAwayCancelTheirGenerations) {
  auto f = start();
  auto client = stub(*f);
  {
    const int64_t before = manager_->get(kModel)->stats().cancelled;
    grpc::ClientContext ctx;
    auto stream = client->ModelStreamInfer(&ctx);
    ASSERT_TRUE(stream->Write(long_request()));
    ModelStreamInferResponse first;
    ASSERT_TRUE(stream->Read(&first));
    ctx.TryCancel();
    EXPECT_TRUE(cancelled_within(*manager_, before, std::chrono::seconds(3)));
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  {
    const int64_t before = manager_->get(kModel)->stats().cancelled;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(100));
    ModelInferResponse out;
    EXPECT_EQ(client->ModelInfer(&ctx, long_request(), &out).error_code(),
              grpc::StatusCode::DEADLINE_EXCEEDED);
    EXPECT_TRUE(cancelled_within(*manager_, before, std::chrono::seconds(3)));
  }
}

// shutdown(deadline) returns soon after the deadline with an idle stream and a running
// generation open, and the generation is cancelled.
TEST_F(GrpcFrontendTest, ShutdownEndsOpenStreamsAtTheDeadline) {
  auto f = start();
  auto client = stub(*f);
  const int64_t before = manager_->get(kModel)->stats().cancelled;
  grpc::ClientContext idle_ctx, busy_ctx;
  auto idle = client->ModelStreamInfer(&idle_ctx);
  auto busy = client->ModelStreamInfer(&busy_ctx);
  ASSERT_TRUE(busy->Write(long_request()));
  ModelStreamInferResponse first;
  ASSERT_TRUE(busy->Read(&first));
  const auto start_time = Clock::now();
  f->shutdown(Clock::now() + std::chrono::milliseconds(200));
  EXPECT_LT(Clock::now() - start_time, std::chrono::seconds(2));
  EXPECT_TRUE(cancelled_within(*manager_, before, std::chrono::seconds(3)));
  // grpc++ wants a stream read to its end before Finish().
  ModelStreamInferResponse rest;
  while (idle->Read(&rest)) {
  }
  while (busy->Read(&rest)) {
  }
  EXPECT_FALSE(idle->Finish().ok());
  EXPECT_FALSE(busy->Finish().ok());
}

// The grpc-js tests (tests/server/grpc.test.mjs) against this process' server.
TEST_F(GrpcFrontendTest, NodeClients) {
  const fs::path dir = fs::path(KILN_SOURCE_DIR) / "tests" / "server";
  if (!fs::exists(dir / "node_modules" / "@grpc" / "grpc-js") ||
      std::system("node --version > /dev/null 2>&1") != 0)
    GTEST_SKIP() << "node or " << (dir / "node_modules").string()
                 << " missing (cd tests/server && npm ci)";
  auto f = start();
  const std::string command =
      "cd '" + dir.string() + "' && KILN_GRPC_ADDR=127.0.0.1:" + std::to_string(f->port()) +
      " KILN_MODEL=" + kModel + " KILN_MODEL_CONTROL=explicit KILN_PLAN='" + plan_path() +
      "' KILN_BIN='" + KILN_BINARY + "' node --test grpc.test.mjs";
  EXPECT_EQ(std::system(command.c_str()), 0) << command;
}

}  // namespace
}  // namespace kiln::server
