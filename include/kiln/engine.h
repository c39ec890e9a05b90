// kiln's public runtime API: load a plan and generate text. This header and generate.h are all
// an application needs; they include nothing internal. Errors are thrown as std::runtime_error
// (kiln::Error) with a message naming the file, field or request at fault.
//
//   auto engine = kiln::Engine::load("t5.plan");
//   auto results = engine->generate({"reverse: suvogi"}, engine->default_params());
//   std::cout << results[0].text << "\n";
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
};

struct TextResult {
  std::vector<int64_t> input_ids;  // the prompt after the template, tokenized
  GenerationResult generation;
  std::string text;  // the generated ids decoded (special tokens skipped)
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
  // Generates for every prompt (the template applied), batched; results in prompt order.
  std::vector<TextResult> generate(const std::vector<std::string>& prompts,
                                   const GenerationParams& params);

 private:
  struct Impl;
  explicit Engine(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace kiln
