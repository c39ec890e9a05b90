// The HF directory importer: config → typed struct → the architecture's graph builder.
#include <filesystem>

#include "frontend/hf/frontend.h"
#include "tokenizer/tokenizer.h"

namespace kiln {

ModelIR import_hf_model(const std::string& dir, const Logger& log) {
  KILN_CHECK(std::filesystem::is_directory(dir),
             "model directory '{}' does not exist (expected a HuggingFace checkpoint directory "
             "with config.json and model.safetensors)",
             dir);
  ModelIR model;
  const ModelConfig config = load_model_config(dir);
  log.info("loading {} checkpoint from {}", architecture_name(config.arch), dir);
  for (const std::string& field : config.unsupported_generation)
    log.warn("{}/generation_config.json: {} is not supported by kiln and is ignored", dir, field);
  model.desc = describe_model(config);
  check_model_desc(model.desc, dir);
  model.source_config_json = model_config_to_json(config);
  model.profile.max_input_tokens = model.desc.max_positions;
  model.profile.max_step_tokens = model.desc.max_positions;
  model.profile.token_buckets = ShapeProfile::default_buckets(model.profile.max_step_tokens);
  check_tokenizer_files(dir);
  const std::unique_ptr<Tokenizer> tok = load_tokenizer_dir(dir);
  model.tokenizer_format = std::string(tokenizer_kind_name(tok->kind()));
  model.tokenizer_bytes = tok->source_bytes();
  model.tokenizer_pieces = tok->vocab_size();
  const Checkpoint ckpt = Checkpoint::open_dir(dir);
  model.weights_digest = checkpoint_digest(ckpt);
  log.info("checkpoint: {} tensors in {} file(s), digest {}", ckpt.tensors().size(),
           ckpt.files().size(), model.weights_digest);
  build_model_graphs(model, config, ckpt, log);
  return model;
}

void build_model_graphs(ModelIR& model, const ModelConfig& config, const Checkpoint& ckpt,
                        const Logger& log) {
  switch (config.arch) {
    case Architecture::kT5:
      model.graphs = build_t5_graphs(config.t5(), ckpt, log);
      break;
    case Architecture::kBloom:
      model.graphs = build_bloom_graphs(config.bloom(), ckpt, log);
      break;
  }
  for (const Graph& g : model.graphs)
    log.info("graph '{}': {} nodes, {} values, {:.1f} MiB of weights", g.name, g.nodes.size(),
             g.values.size(), static_cast<double>(g.weight_bytes()) / (1 << 20));
}

}  // namespace kiln
