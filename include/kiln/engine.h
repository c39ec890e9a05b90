// kiln's public runtime API: an Engine is a compiled model ready to run — loaded from a plan file
// (weights mmapped, not copied) or built in memory from a HuggingFace directory.
#pragma once

#include <memory>
#include <string>

#include "backend/backend.h"
#include "core/context.h"
#include "graph/model_ir.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

struct BuildOptions {
  Device device = Device::kCpu;
  DType precision = DType::kF32;
  std::string prompt_template = "{prompt}";
  int64_t max_input_tokens = 0;  // 0: the architecture's default (T5 512, BLOOM 2048)
  bool optimize = true;          // run the pass pipeline
};

// Imports an HF checkpoint directory and runs the pass pipeline (what `kiln build` does before
// writing the plan).
ModelIR build_model(const std::string& hf_dir, const BuildOptions& options, const Logger& log);

class Engine {
 public:
  // Takes an optimized model (from build_model or a plan) and compiles its graphs for the CPU.
  Engine(Context& ctx, ModelIR model);
  static std::unique_ptr<Engine> from_plan(Context& ctx, const std::string& path);
  static std::unique_ptr<Engine> from_model_dir(Context& ctx, const std::string& dir,
                                                const BuildOptions& options = {});

  Context& context() { return ctx_; }
  const ModelIR& model() const { return model_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }
  Executable& encoder();  // encoder-decoder models only
  Executable& decoder();
  const Backend& backend() const { return *backend_; }

 private:
  Context& ctx_;
  ModelIR model_;
  std::unique_ptr<Tokenizer> tokenizer_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<Executable> encoder_;
  std::unique_ptr<Executable> decoder_;
};

}  // namespace kiln
