// Real-size checkpoints without downloads: `kiln synth` writes a HuggingFace-layout directory
// (config.json, generation_config.json, model.safetensors, the fixture model's tokenizer files)
// with the public models' exact shapes and random weights, which HuggingFace transformers loads
// as is — so kiln and HF can run the very same weights. For speed and memory work only: the
// weights are random, the text they produce is meaningless.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "core/dtype.h"

namespace kiln {

struct SynthPreset {
  std::string name;    // "flan-t5-base"
  std::string family;  // "t5" or "bloom"
  int64_t hidden = 0;  // d_model / hidden_size
  int64_t d_ff = 0;    // T5 only (BLOOM: 4 * hidden)
  int64_t d_kv = 64;   // T5 only
  int64_t heads = 0;
  int64_t layers = 0;          // encoder layers (T5) or layers (BLOOM)
  int64_t decoder_layers = 0;  // T5 only
  int64_t vocab = 0;
  bool gated = true;  // T5: gated-gelu (Flan-T5) or relu (T5 v1.0)
  bool tied = false;  // T5: lm_head tied to the shared embedding (and decoder output scaled)
};

const std::vector<SynthPreset>& synth_presets();
// Throws a usage error listing the presets when `name` is unknown.
const SynthPreset& find_synth_preset(const std::string& name);
int64_t synth_parameter_count(const SynthPreset& preset);

struct SynthOptions {
  DType dtype = DType::kF32;  // f32, f16 or bf16
  uint64_t seed = 0;
  // An existing non-empty `dir` is refused (usage error naming -o and --force) unless this is
  // set; then it is replaced whole.
  bool replace_existing = false;
};

// Writes the checkpoint as `dir` (its parent directories created if needed), all at once: the
// files go into DIR.partial.PID beside it, renamed to DIR when complete (AtomicDirWriter), so
// that a failure, an interrupt or a concurrent synth into the same DIR never leaves a partial
// or mixed checkpoint. `progress(bytes_done, bytes_total)`.
void synthesize_checkpoint(const SynthPreset& preset, const std::string& dir,
                           const SynthOptions& options,
                           const std::function<void(int64_t, int64_t)>& progress);

// The fixture tokenizers built into the binary ("t5/spiece.model", "bloom/tokenizer.json", ...).
std::string_view embedded_file(std::string_view name);

}  // namespace kiln
