// HuggingFace checkpoints → ModelIR. Each architecture has its own file (t5.cc, bloom.cc) that
// turns a typed config and the checkpoint's tensors into graphs with the GraphBuilder.
#pragma once

#include <string>

#include "core/logging.h"
#include "frontend/hf/hf_config.h"
#include "graph/model_ir.h"
#include "io/safetensors.h"

namespace kiln {

std::vector<Graph> build_t5_graphs(const T5Config& config, const Checkpoint& ckpt,
                                   const Logger& log);
std::vector<Graph> build_bloom_graphs(const BloomConfig& config, const Checkpoint& ckpt,
                                      const Logger& log);
// The architecture's graphs for `config` from `ckpt` into model.graphs, with a log line per
// graph (the HF and ONNX importers' last step).
void build_model_graphs(ModelIR& model, const ModelConfig& config, const Checkpoint& ckpt,
                        const Logger& log);

// Reads config, generation config, tokenizer and weights of an HF model directory and builds
// its graphs (before any pass), with the model description filled in and the default shape
// profile (max input tokens = the architecture's positions). Errors name the directory and the
// file at fault.
ModelIR import_hf_model(const std::string& dir, const Logger& log);

// Refuses (naming the file and what to do) a T5 checkpoint directory without spiece.model, the
// only T5 tokenizer kiln reads; other directories pass (their loaders check them).
void check_tokenizer_files(const std::string& dir);

}  // namespace kiln
