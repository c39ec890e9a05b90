#include "frontend/onnx/onnx_frontend.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "frontend/hf/frontend.h"
#include "frontend/onnx/supported_ops.h"
#include "io/safetensors.h"
#include "tokenizer/tokenizer.h"

namespace kiln {
namespace fs = std::filesystem;

LiftedFile lift_onnx_file(const std::string& path, const Logger& log) {
  LiftedFile f;
  f.model = std::make_unique<OnnxModel>(read_onnx_model(path));
  f.graph = std::make_unique<ImportGraph>(ImportGraph::build(*f.model));
  check_supported_ops(*f.graph);
  const std::map<std::string, Shape> probe = lift_probe_shapes(*f.graph);
  try {
    f.pattern = std::make_unique<PatternGraph>(*f.graph, probe);
  } catch (const Error& e) {
    std::string shapes;
    for (const auto& [name, shape] : probe)
      shapes += fmt::format("{}{} {}", shapes.empty() ? "" : ", ", name, shape_str(shape));
    KILN_FAIL("{}: lifting folds the graph for probe inputs ({}), which failed: {}", path, shapes,
              e.what());
  }
  f.lifted = lift_import_graph(*f.pattern, log);
  return f;
}

std::string t5_half(const ImportGraph& graph, const LiftResult& lifted) {
  for (const LiftedOp& op : lifted.ops)
    if (op.kind == LiftedKind::kRmsNorm)
      return graph.find_value("encoder_hidden_states") >= 0 ? "decoder" : "encoder";
  return "";
}

std::vector<std::string> resolve_onnx_sources(const std::vector<std::string>& args) {
  KILN_CHECK_USAGE(!args.empty() && args.size() <= 2,
                   "--onnx: give one file (BLOOM), two files (T5 encoder and decoder) or a "
                   "folder, got {} arguments",
                   args.size());
  std::error_code ec;
  if (args.size() == 1 && fs::is_directory(args[0], ec)) {
    const fs::path dir(args[0]);
    if (fs::exists(dir / "encoder_model.onnx", ec) && fs::exists(dir / "decoder_model.onnx", ec))
      return {(dir / "encoder_model.onnx").string(), (dir / "decoder_model.onnx").string()};
    // A decoder-only export: optimum's model.onnx, or decoder_model.onnx (the one without
    // past inputs) of its older layout.
    for (const char* name : {"model.onnx", "decoder_model.onnx"})
      if (fs::exists(dir / name, ec)) return {(dir / name).string()};
    KILN_CHECK_USAGE(false,
                     "--onnx {}: the folder has neither encoder_model.onnx and "
                     "decoder_model.onnx (optimum's T5 export) nor model.onnx or "
                     "decoder_model.onnx (a causal LM)",
                     args[0]);
  }
  for (const std::string& a : args)
    KILN_CHECK_USAGE(fs::is_regular_file(a, ec), "--onnx {}: no such file", a);
  return args;
}

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  KILN_CHECK_USAGE(in.good(), "--tokenizer {}: cannot read the file", path);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

std::unique_ptr<Tokenizer> load_tokenizer_file(const std::string& path) {
  KILN_CHECK_USAGE(!path.empty(),
                   "an ONNX file carries no tokenizer: give --tokenizer tokenizer.json (BLOOM) or "
                   "--tokenizer spiece.model (T5)");
  if (path.ends_with(".model")) return make_sentencepiece_tokenizer(read_file(path), path);
  KILN_CHECK_USAGE(path.ends_with(".json"),
                   "--tokenizer {}: expected tokenizer.json (byte-level BPE) or spiece.model "
                   "(SentencePiece)",
                   path);
  return make_bpe_tokenizer(read_file(path), path);
}

}  // namespace

ModelIR import_onnx_model(const std::vector<std::string>& onnx_files,
                          const std::string& tokenizer_file, const Logger& log) {
  std::unique_ptr<Tokenizer> tok = load_tokenizer_file(tokenizer_file);
  std::vector<LiftedFile> files;
  for (const std::string& path : onnx_files) {
    log.info("onnx: importing and lifting {}", path);
    files.push_back(lift_onnx_file(path, log));
  }
  LiftedModel lifted;
  std::string source;
  if (files.size() == 1) {
    const std::string half = t5_half(*files[0].graph, files[0].lifted);
    KILN_CHECK_USAGE(half.empty(),
                     "{}: this is a T5 {} export; a T5 plan is built from the encoder and the "
                     "decoder exports together: kiln build --onnx ENCODER.onnx --onnx "
                     "DECODER.onnx (or --onnx FOLDER with optimum's encoder_model.onnx and "
                     "decoder_model.onnx)",
                     onnx_files[0], half);
    lifted = assemble_bloom(*files[0].pattern, files[0].lifted, log);
    source = onnx_files[0];
  } else {
    // The decoder is the export that reads the encoder's states.
    const bool first_is_decoder = files[0].graph->find_value("encoder_hidden_states") >= 0;
    const LiftedFile& enc = files[first_is_decoder ? 1 : 0];
    const LiftedFile& dec = files[first_is_decoder ? 0 : 1];
    KILN_CHECK(dec.graph->find_value("encoder_hidden_states") >= 0,
               "{} and {}: neither reads 'encoder_hidden_states', so neither is a T5 decoder "
               "export",
               onnx_files[0], onnx_files[1]);
    lifted = assemble_t5(*enc.pattern, enc.lifted, *dec.pattern, dec.lifted, log);
    source = onnx_files[0] + " + " + onnx_files[1];
  }
  for (const std::string& note : lifted.notes) log.info("onnx: {}", note);

  ModelIR model;
  model.desc = describe_model(lifted.config);
  check_model_desc(model.desc, source);
  model.source_config_json = model_config_to_json(lifted.config);
  model.profile.max_input_tokens = model.desc.max_positions;
  model.profile.max_step_tokens = model.desc.max_positions;
  model.profile.token_buckets = ShapeProfile::default_buckets(model.profile.max_step_tokens);
  model.tokenizer_format = std::string(tokenizer_kind_name(tok->kind()));
  model.tokenizer_bytes = tok->source_bytes();
  model.tokenizer_pieces = tok->vocab_size();
  if (tok->vocab_size() > model.desc.vocab_size)
    log.warn("--tokenizer {}: {} pieces, more than the model's vocabulary of {}", tokenizer_file,
             tok->vocab_size(), model.desc.vocab_size);
  const Checkpoint ckpt = Checkpoint::from_tensors(source, std::move(lifted.tensors));
  model.weights_digest = checkpoint_digest(ckpt);
  build_model_graphs(model, lifted.config, ckpt, log);
  return model;
}

}  // namespace kiln
