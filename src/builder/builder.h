// The compiler driver: an HF checkpoint → frontend → passes → a ModelIR ready to write as a plan
// or to compile in memory. It sits above the runtime so that the runtime links no frontend or
// pass (`kiln run --plan` needs only plan loading).
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/context.h"
#include "graph/model_ir.h"
#include "passes/pass.h"
#include "runtime/compiled_model.h"

namespace kiln {

// The default step size of cuda plans: a batch of 64 prompts of 64 tokens prefills in one step.
inline constexpr int64_t kCudaStepTokens = 4096;

struct BuildOptions {
  Device device = Device::kCpu;
  Precision precision = Precision::kFp32;
  // Layers kept in f32 whatever the precision, and later a calibration's result (the precision
  // pass: passes/pass.h).
  PrecisionOptions precision_options;
  // What the KV cache stores (--kv-cache; kFp8: CUDA plans only).
  KvCache kv_cache = KvCache::kAuto;
  std::string prompt_template = "{prompt}";
  int64_t max_input_tokens = 0;  // 0: the model's positions (T5 512, BLOOM 2048)
  int64_t max_batch = 256;       // most sequences (logits rows) per step the plan is sized for
  // Most tokens one step runs (prefill of several prompts at once); 0: the longest prompt or
  // max_batch, whichever is more, and at least kCudaStepTokens on cuda (GPUs prefill best in
  // large steps). Never below the longest prompt (T5 encodes a prompt in one step).
  int64_t max_step_tokens = 0;
  bool optimize = true;  // run the pass pipeline
  bool tf32 = false;     // cuda fp32: GEMMs may use TF32 tensor cores (--tf32)
  // CPU plans: pack the Linear weights for this kernel family (kAvx512: the panel16 layout, and
  // the plan records "target": "avx512"); unset or kAvx2: plain row-major weights, which any CPU
  // runs (the AVX-512 kernels pack them when the plan is loaded). `kiln build` passes the
  // building machine's family.
  std::optional<CpuIsa> pack_for_cpu;
  // A folder for the weights the passes make (io/weight_spill.h): they are kept in a temporary
  // file there instead of memory, so that the build's resident memory stays near its largest
  // tensor's (`kiln build` uses the plan's folder). Empty: in memory.
  std::string spill_dir;
};

// Where a model's weights and graphs come from: an HF checkpoint directory, or ONNX exports (a
// BLOOM causal LM file, or a T5 encoder and decoder) and the tokenizer file they do not carry.
// A directory converts implicitly: most builds are of checkpoints.
struct ModelSource {
  std::string hf_dir;
  std::vector<std::string> onnx_files;
  std::string tokenizer;  // with onnx_files

  ModelSource(std::string dir) : hf_dir(std::move(dir)) {}  // NOLINT: a directory is a source
  ModelSource(const char* dir) : hf_dir(dir) {}             // NOLINT
  static ModelSource onnx(std::vector<std::string> files, std::string tokenizer_file);
  bool is_onnx() const { return !onnx_files.empty(); }
  std::string label() const;  // the directory, or the files joined by " + "
};

// Imports an HF checkpoint directory and runs the pass pipeline (what `kiln build` does before
// writing the plan). Unsupported targets are refused before any work, naming why.
ModelIR build_model(const std::string& hf_dir, const BuildOptions& options, const Logger& log);
// Either source: build_model or build_model_from_onnx.
ModelIR build_model(const ModelSource& source, const BuildOptions& options, const Logger& log);

// The same from ONNX exports (frontend/onnx/onnx_frontend.h): a BLOOM causal LM file or a T5
// encoder and decoder, lifted into the model the HF checkpoint would give, and the tokenizer
// file the exports do not carry.
ModelIR build_model_from_onnx(const std::vector<std::string>& onnx_files,
                              const std::string& tokenizer_file, const BuildOptions& options,
                              const Logger& log);
// build_model in two halves: the checkpoint imported and the passes before the precision pass
// run (the float plan's graphs, options checked), then the precision pass and what follows it.
// A caller that makes several precision plans of one model (the sensitivity fallback,
// builder/sensitivity.h) imports once and finishes copies: weights are shared, not copied.
ModelIR import_for_precision(const ModelSource& source, const BuildOptions& options,
                             const Logger& log);
void finish_build(ModelIR& model, const BuildOptions& options, const Logger& log);

// Tactic selection for CUDA plans (`kiln build --device cuda`): every Linear's kernel and
// cuBLASLt algorithm per row count, timed on the visible GPU and stored in the model. Logs and
// does nothing without a GPU (kernels are then chosen at run time) or for CPU plans.
void select_tactics(ModelIR& model, Context& ctx);

// build_model, then compile for this context (`kiln run --model`, the quick path).
std::unique_ptr<CompiledModel> compile_model_dir(Context& ctx, const std::string& hf_dir,
                                                 const BuildOptions& options = {});

}  // namespace kiln
