// kiln perf's gRPC client (KServe v2 inference.GRPCInferenceService) against an in-process gRPC
// server that answers with known outputs at known times: text in either tensor form, token ids
// counted, Triton's final-response flag, errors, and only lower bounds of times checked.
#include <fmt/format.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <mutex>
#include <thread>

#include "grpc_service.grpc.pb.h"
#include "perf_client.h"

namespace kiln::cli::perf {
namespace {

using std::chrono::milliseconds;

double ms(Clock::duration d) { return std::chrono::duration<double, std::milli>(d).count(); }

// A raw BYTES tensor of one element: a 4-byte little-endian length, then the bytes.
std::string raw_bytes(const std::string& s) {
  std::string out(4, '\0');
  for (int i = 0; i < 4; ++i) out[i] = static_cast<char>((s.size() >> (8 * i)) & 0xFF);
  return out + s;
}

// Adds text_output (in `contents` or, when `raw`, in raw_output_contents) and, unless
// `no_ids`, a token_ids tensor of `ids` elements.
void add_outputs(inference::ModelInferResponse& res, const std::string& text, int ids, bool raw,
                 bool no_ids) {
  auto* t = res.add_outputs();
  t->set_name("text_output");
  t->set_datatype("BYTES");
  t->add_shape(1);
  if (!raw) t->mutable_contents()->add_bytes_contents(text);
  if (!no_ids) {
    auto* o = res.add_outputs();
    o->set_name("token_ids");
    o->set_datatype("INT64");
    o->add_shape(ids);
    if (raw) {
      res.add_raw_output_contents(raw_bytes(text));
      res.add_raw_output_contents(std::string(8 * ids, '\0'));
    } else {
      for (int i = 0; i < ids; ++i) o->mutable_contents()->add_int64_contents(i);
    }
  } else if (raw) {
    res.add_raw_output_contents(raw_bytes(text));
  }
}

class FakeService final : public inference::GRPCInferenceService::Service {
 public:
  grpc::Status ModelInfer(grpc::ServerContext* ctx, const inference::ModelInferRequest* req,
                          inference::ModelInferResponse* res) override {
    remember(ctx, *req);
    if (req->model_name() != "m") return {grpc::StatusCode::NOT_FOUND, "no model named x"};
    add_outputs(*res, " a b c", 3, false, false);
    return grpc::Status::OK;
  }

  // max_tokens responses of one token each, the first after 30 ms and then every 10 ms;
  // alternately in contents and in raw form.
  grpc::Status ModelStreamInfer(
      grpc::ServerContext* ctx,
      grpc::ServerReaderWriter<inference::ModelStreamInferResponse, inference::ModelInferRequest>*
          stream) override {
    inference::ModelInferRequest req;
    while (stream->Read(&req)) {
      remember(ctx, req);
      if (req.model_name() != "m") {
        inference::ModelStreamInferResponse err;
        err.set_error_message("no model named " + req.model_name());
        stream->Write(err);
        continue;
      }
      const int64_t n = req.parameters().at("max_tokens").int64_param();
      for (int64_t i = 0; i < n; ++i) {
        std::this_thread::sleep_for(milliseconds(i == 0 ? 30 : (slow ? 400 : 10)));
        inference::ModelStreamInferResponse r;
        add_outputs(*r.mutable_infer_response(), " t", 1, i % 2 == 1, no_ids);
        if (final_flag && i == n - 1)
          (*r.mutable_infer_response()->mutable_parameters())["triton_final_response"]
              .set_bool_param(true);
        if (!stream->Write(r)) return grpc::Status::OK;  // the client went away
      }
      // With the final flag, a client has no reason to wait for the end of the stream.
      if (final_flag) std::this_thread::sleep_for(milliseconds(1500));
    }
    return grpc::Status::OK;
  }

  void remember(grpc::ServerContext* ctx, const inference::ModelInferRequest& req) {
    std::lock_guard<std::mutex> lock(mu);
    last = req;
    const auto auth = ctx->client_metadata().find("authorization");
    last_auth = auth == ctx->client_metadata().end()
                    ? ""
                    : std::string(auth->second.data(), auth->second.size());
  }

  std::mutex mu;
  inference::ModelInferRequest last;
  std::string last_auth;
  std::atomic<bool> no_ids{false}, final_flag{false}, slow{false};
};

class FakeGrpcServer {
 public:
  FakeGrpcServer() {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    b.RegisterService(&service);
    server_ = b.BuildAndStart();
  }
  ~FakeGrpcServer() { server_->Shutdown(std::chrono::system_clock::now() + milliseconds(100)); }
  Target target(bool stream) const {
    Target t;
    parse_url(fmt::format("127.0.0.1:{}", port_), t);
    t.model = "m";
    t.protocol = Protocol::kGrpc;
    t.stream = stream;
    t.output_len = 5;
    return t;
  }
  FakeService service;

 private:
  int port_ = 0;
  std::unique_ptr<grpc::Server> server_;
};

TEST(PerfGrpc, Streamed) {
  FakeGrpcServer server;
  Target t = server.target(true);
  t.api_key = "sk-test";
  Connection c(t);
  const RequestResult r = run_grpc(c, t, "hello");
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.output_tokens, 5);
  EXPECT_TRUE(r.tokens_counted_by_server);
  ASSERT_TRUE(r.first_token && r.last_token);
  EXPECT_GE(ms(*r.first_token - r.sent), 30);
  EXPECT_GE(ms(*r.last_token - *r.first_token), 40);
  {
    std::lock_guard<std::mutex> lock(server.service.mu);
    const inference::ModelInferRequest& q = server.service.last;
    EXPECT_EQ(server.service.last_auth, "Bearer sk-test");
    ASSERT_EQ(q.inputs_size(), 1);
    EXPECT_EQ(q.inputs(0).name(), "text_input");
    EXPECT_EQ(q.inputs(0).datatype(), "BYTES");
    EXPECT_EQ(q.inputs(0).contents().bytes_contents(0), "hello");
    EXPECT_EQ(q.parameters().at("max_tokens").int64_param(), 5);
    EXPECT_EQ(q.parameters().at("temperature").double_param(), 0.0);
    EXPECT_TRUE(q.parameters().at("return_token_ids").bool_param());
  }

  // Without token ids: the responses that carried text.
  server.service.no_ids = true;
  const RequestResult counted = run_request(c, t, "hello");
  ASSERT_EQ(counted.error, "");
  EXPECT_EQ(counted.output_tokens, 5);
  EXPECT_FALSE(counted.tokens_counted_by_server);
}

TEST(PerfGrpc, FinalResponseEndsTheRequest) {
  FakeGrpcServer server;
  server.service.final_flag = true;  // and then the server keeps the stream open for 1.5 s
  const Target t = server.target(true);
  Connection c(t);
  const RequestResult r = run_grpc(c, t, "hello");
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.output_tokens, 5);
  EXPECT_LT(ms(r.done - *r.last_token), 1000);
}

TEST(PerfGrpc, Whole) {
  FakeGrpcServer server;
  const Target t = server.target(false);
  Connection c(t);
  const RequestResult r = run_grpc(c, t, "hello");
  ASSERT_EQ(r.error, "");
  EXPECT_EQ(r.output_tokens, 3);
  EXPECT_TRUE(r.tokens_counted_by_server);
  EXPECT_FALSE(r.first_token.has_value());
}

TEST(PerfGrpc, Errors) {
  FakeGrpcServer server;
  Target t = server.target(false);
  t.model = "x";
  Connection c(t);
  RequestResult r = run_grpc(c, t, "hello");
  EXPECT_EQ(r.error, "gRPC NOT_FOUND: no model named x");
  EXPECT_FALSE(r.unreachable);
  t.stream = true;
  r = run_grpc(c, t, "hello");
  EXPECT_EQ(r.error, "the server said: no model named x");
  EXPECT_FALSE(r.unreachable);
}

TEST(PerfGrpc, Unreachable) {
  int port = 0;
  {
    FakeGrpcServer gone;
    port = std::stoi(gone.target(false).scheme_host_port.substr(17));  // "http://127.0.0.1:"
  }
  Target t;
  parse_url(fmt::format("127.0.0.1:{}", port), t);
  t.model = "m";
  t.protocol = Protocol::kGrpc;
  t.timeout_s = 5;
  Connection c(t);
  const RequestResult r = run_grpc(c, t, "hello");
  EXPECT_TRUE(r.unreachable) << r.error;
  EXPECT_EQ(r.error.rfind("gRPC UNAVAILABLE", 0), 0u) << r.error;
}

TEST(PerfGrpc, AbandonedAtTheDeadline) {
  FakeGrpcServer server;
  server.service.slow = true;
  const Target t = server.target(true);
  Connection c(t);
  const Clock::time_point deadline = Clock::now() + milliseconds(100);
  const RequestResult r = run_grpc(c, t, "hello", deadline);
  EXPECT_FALSE(r.error.empty());
  EXPECT_GT(r.done, deadline);  // so never counted
  EXPECT_LT(ms(r.done - deadline), 2000);
}

}  // namespace
}  // namespace kiln::cli::perf
