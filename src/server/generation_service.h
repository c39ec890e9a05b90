// The protocol-neutral request path every frontend (KServe HTTP/gRPC, the generate extension,
// OpenAI) goes through: request parameters checked and turned into GenerationParams, the
// prompt checked (UTF-8, length), templated and tokenized, enqueued on an instance, and its
// response stream read with cancellation. Parameter names in errors are the protocols' own
// (max_tokens, temperature, ...), since that is what the client sent.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "io/jsonl.h"
#include "runtime/generation_executor.h"
#include "server/errors.h"
#include "server/model_manager.h"

namespace kiln::server {

// The sampling and limit parameters a request may set; unset ones keep the model's defaults.
struct RequestParams {
  std::optional<int64_t> max_tokens;
  std::optional<int64_t> min_tokens;
  std::optional<double> temperature;  // 0: greedy
  std::optional<int64_t> top_k;
  std::optional<double> top_p;
  std::optional<uint64_t> seed;
  std::optional<int64_t> beam_width;
  std::optional<double> repetition_penalty;
  std::optional<double> length_penalty;
  std::optional<bool> ignore_eos;
  std::vector<std::string> stop;
  bool return_token_ids = false;
  std::optional<int64_t> timeout_us;  // the whole request
  // Sets the field named `key` from a JSON value (KServe parameters, generate's body, OpenAI's
  // body use the same names); returns false for a key that is not a generation parameter.
  // Throws a kBadRequest ServerError naming the key for a value of the wrong type or range.
  bool set(const std::string& key, const nlohmann::json& value);
};

// The model's defaults (generation_config, the config's default_max_tokens), then `p`.
// Throws kBadRequest naming the field (max_tokens above the plan's limit included).
GenerationParams resolve_params(const LoadedModel& model, const RequestParams& p);

struct TextRequest {
  std::string prompt;
  bool apply_template = true;
  RequestParams params;
  uint64_t seed_index = 0;  // n > 1: completion i samples from derive_seed(seed, i)
  std::string protocol;     // for the request log: kserve, generate, openai, grpc
};

// Runs the parsing and checks of a request already routed to `model`; a refusal they throw
// counts in the model's `refused` (Triton's failure count: these never reach an executor) and
// propagates.
template <typename F>
auto counting_refusals(LoadedModel& model, F&& parse) -> decltype(parse()) {
  try {
    return parse();
  } catch (...) {
    ++model.refused;
    throw;
  }
}

// One request on one instance. Destroying it before the end cancels the generation (a client
// that went away): its KV blocks are freed before the next step.
class Generation {
 public:
  // Checks and enqueues; throws ServerError (kBadRequest, kQueueFull, kUnavailable).
  Generation(std::shared_ptr<LoadedModel> model, const TextRequest& request);
  ~Generation();
  Generation(const Generation&) = delete;
  Generation& operator=(const Generation&) = delete;

  // The next chunks (waits up to `until`); false once the final chunk has been returned.
  bool next(std::vector<ResponseChunk>& out, Clock::time_point until = Clock::time_point::max());
  void cancel();
  const LoadedModel& model() const { return *model_; }
  int64_t input_tokens() const { return static_cast<int64_t>(input_ids_.size()); }
  const std::vector<int64_t>& input_ids() const { return input_ids_; }
  const GenerationParams& params() const { return params_; }
  Clock::time_point queued_at() const { return stream_->queued_at(); }

 private:
  std::shared_ptr<LoadedModel> model_;
  GenerationExecutor* executor_ = nullptr;
  std::vector<int64_t> input_ids_;
  GenerationParams params_;
  std::shared_ptr<ResponseStream> stream_;
  bool done_ = false;

  void check(const TextRequest& request);
};

// Everything of a finished generation, collected (non-streaming responses).
struct Completion {
  std::string text;
  std::vector<int64_t> token_ids;
  FinishReason finish_reason = FinishReason::kLength;
  int64_t input_tokens = 0;
  Clock::time_point first_token{};
};
// Reads `g` to its end; throws ServerError for an error or timeout end (kTimeout, kInternal).
// `client_gone`, when given, is asked every 100 ms while waiting: true (the client closed its
// connection) cancels the generation, which then ends kUnavailable.
Completion collect(Generation& g, const std::function<bool()>& client_gone = {});
// The ServerError a final chunk with an error stands for (timeouts: kTimeout).
ServerError chunk_error(const ResponseChunk& last);

// Strict UTF-8 (io/jsonl.h's check: no overlongs, surrogates or code points past U+10FFFF).
inline bool valid_utf8(const std::string& s) {
  return invalid_utf8_offset(s) == std::string_view::npos;
}

}  // namespace kiln::server
