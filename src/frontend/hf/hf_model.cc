// The HF directory importer: config → typed struct → the architecture's graph builder.
#include <filesystem>

#include "frontend/hf/frontend.h"

namespace kiln {

ModelIR import_hf_model(const std::string& dir, const Logger& log) {
  KILN_CHECK(std::filesystem::is_directory(dir),
             "model directory '{}' does not exist (expected a HuggingFace checkpoint directory "
             "with config.json and model.safetensors)",
             dir);
  ModelIR model;
  model.config = load_model_config(dir);
  log.info("loading {} checkpoint from {}", architecture_name(model.config.arch), dir);
  const std::unique_ptr<Tokenizer> tok = load_tokenizer_dir(dir);
  model.tokenizer_kind = tok->kind();
  model.tokenizer_bytes = tok->source_bytes();
  const Checkpoint ckpt = Checkpoint::open_dir(dir);
  log.info("checkpoint: {} tensors in {} file(s)", ckpt.tensors().size(), ckpt.files().size());
  switch (model.config.arch) {
    case Architecture::kT5:
      model.graphs = build_t5_graphs(model.config.t5(), ckpt, log);
      break;
    case Architecture::kBloom:
      model.graphs = build_bloom_graphs(model.config.bloom(), ckpt, log);
      break;
  }
  for (const Graph& g : model.graphs)
    log.info("graph '{}': {} nodes, {} values, {:.1f} MiB of weights", g.name, g.nodes.size(),
             g.values.size(), static_cast<double>(g.weight_bytes()) / (1 << 20));
  return model;
}

}  // namespace kiln
