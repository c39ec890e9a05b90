// ONNX exports → ModelIR: each file read, imported, checked for unsupported ops, lifted, and
// the lifted graphs assembled into a BLOOM causal LM (one file) or a T5 encoder + decoder (two
// files, or a folder with optimum's encoder_model.onnx / decoder_model.onnx), whose config and
// weights then go through the HF frontend's graph builders: a plan from ONNX is a generation
// plan like one from the checkpoint.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/logging.h"
#include "frontend/onnx/lift_model.h"
#include "graph/model_ir.h"
#include "io/onnx/onnx_model.h"

namespace kiln {

// One ONNX file, imported and lifted (kept together: the pattern graph reads the import graph).
struct LiftedFile {
  std::unique_ptr<OnnxModel> model;
  std::unique_ptr<ImportGraph> graph;
  std::unique_ptr<PatternGraph> pattern;
  LiftResult lifted;
};
// Throws kiln::Error for a file that cannot be read or imported, and one error listing every
// unsupported op.
LiftedFile lift_onnx_file(const std::string& path, const Logger& log);

// "encoder" or "decoder" for a lifted graph that is half of a T5 (T5's RMSNorm lifted; the
// decoder is the half that reads encoder_hidden_states), empty otherwise.
std::string t5_half(const ImportGraph& graph, const LiftResult& lifted);

// The files of `--onnx` arguments: one or two files, or one folder holding optimum's
// encoder_model.onnx and decoder_model.onnx (decoder_with_past_model.onnx is not needed: kiln
// keeps its own KV cache), or a causal LM's model.onnx or decoder_model.onnx. Usage errors name
// what is missing.
std::vector<std::string> resolve_onnx_sources(const std::vector<std::string>& args);

// Lifts and assembles the exports and builds the model's graphs (before any pass), with the
// tokenizer from `tokenizer_file` (tokenizer.json or spiece.model) and the default profile.
ModelIR import_onnx_model(const std::vector<std::string>& onnx_files,
                          const std::string& tokenizer_file, const Logger& log);

}  // namespace kiln
