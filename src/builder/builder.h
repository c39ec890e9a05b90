// The compiler driver: an HF checkpoint → frontend → passes → a ModelIR ready to write as a plan
// or to compile in memory. It sits above the runtime so that the runtime links no frontend or
// pass (`kiln run --plan` needs only plan loading).
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "core/context.h"
#include "graph/model_ir.h"
#include "runtime/compiled_model.h"

namespace kiln {

struct BuildOptions {
  Device device = Device::kCpu;
  Precision precision = Precision::kFp32;
  std::string prompt_template = "{prompt}";
  int64_t max_input_tokens = 0;  // 0: the model's positions (T5 512, BLOOM 2048)
  int64_t max_batch = 256;       // most sequences (logits rows) per step the plan is sized for
  bool optimize = true;          // run the pass pipeline
  // CPU plans: pack the Linear weights for this kernel family (kAvx512: the panel16 layout, and
  // the plan records "target": "avx512"); unset or kAvx2: plain row-major weights, which any CPU
  // runs (the AVX-512 kernels pack them when the plan is loaded). `kiln build` passes the
  // building machine's family.
  std::optional<CpuIsa> pack_for_cpu;
};

// Imports an HF checkpoint directory and runs the pass pipeline (what `kiln build` does before
// writing the plan). Unsupported targets are refused before any work, naming why.
ModelIR build_model(const std::string& hf_dir, const BuildOptions& options, const Logger& log);

// build_model, then compile for this context (`kiln run --model`, the quick path).
std::unique_ptr<CompiledModel> compile_model_dir(Context& ctx, const std::string& hf_dir,
                                                 const BuildOptions& options = {});

}  // namespace kiln
