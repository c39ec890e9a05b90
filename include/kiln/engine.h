// kiln's public runtime API: load a plan and generate text. This header and generate.h are all
// an application needs; they include nothing internal. Errors are thrown as std::runtime_error
// (kiln::Error) with a message naming the file, field or request at fault.
//
//   auto engine = kiln::Engine::load("t5.plan");
//   auto results = engine->generate({"reverse: suvogi"}, engine->default_params());
//   std::cout << results[0].text << "\n";
//
// An Engine is shared by threads: each may generate() or submit() at any time, and the requests
// of all of them are batched together by one engine thread (continuous batching: a request
// joins the running batch at the next step and leaves it when it ends, freeing its KV cache).
// submit() returns a Request to read the text as it is generated, or to cancel it:
//
//   auto request = engine->submit("reverse: suvogi", engine->default_params());
//   kiln::TextChunk chunk;
//   while (request->next(chunk)) std::cout << chunk.text << std::flush;
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kiln/generate.h"

namespace kiln {

struct EngineOptions {
  int threads = 0;       // 0: one per hardware thread
  int max_batch = 8;     // sequences generated together
  bool verbose = false;  // log what loading and generation do (stderr)
  // Requests that may wait beyond the max_batch running ones; submit() refuses another with an
  // error saying the queue is full. Negative: no limit.
  int64_t max_queue = -1;
};

struct TextResult {
  std::vector<int64_t> input_ids;  // the prompt after the template, tokenized
  GenerationResult generation;
  std::string text;  // the generated ids decoded (special tokens skipped)
};

// A piece of a request's text: the ids that became final since the last piece and their text.
struct TextChunk {
  std::vector<int64_t> token_ids;  // beam search: every id, in the last chunk
  std::string text;
  bool finished = false;  // the last chunk; finish_reason is set
  FinishReason finish_reason = FinishReason::kLength;
};

// A request in flight (Engine::submit). Read it from one thread; cancel() from any. Destroying
// it before it finished cancels it.
class Request {
 public:
  ~Request();
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  // Waits for the next piece of text. Returns false once the last chunk has been returned.
  // Throws if the generation failed or was cancelled by a timeout.
  bool next(TextChunk& chunk);
  // Waits for the end and returns the whole result (what next() has not returned yet included;
  // a stop string ends the text before it, and finish_reason is kStop).
  TextResult wait();
  // Ends the generation before the next step; next()/wait() then end with kCancelled.
  void cancel();

 private:
  friend class Engine;
  struct Impl;
  explicit Request(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class Engine {
 public:
  // Maps the plan (weights are not copied) and compiles it for this machine.
  static std::unique_ptr<Engine> load(const std::string& plan_path,
                                      const EngineOptions& options = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  std::string architecture() const;  // "t5", "bloom"
  // The model's defaults: HuggingFace's, with the checkpoint's generation_config applied.
  GenerationParams default_params() const;
  std::vector<int64_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int64_t>& ids) const;
  // Wraps a prompt in the plan's prompt template.
  std::string apply_template(const std::string& prompt) const;
  // Generates for every prompt (the template applied), batched with whatever else is running;
  // results in prompt order. Stop strings (params.stop_strings) apply.
  std::vector<TextResult> generate(const std::vector<std::string>& prompts,
                                   const GenerationParams& params);
  // Queues one prompt (the template applied) and returns at once. Throws, naming the field,
  // for bad parameters or a prompt the plan cannot take, and when the queue is full.
  std::unique_ptr<Request> submit(const std::string& prompt, const GenerationParams& params);

 private:
  struct Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
