#include "io/plan.h"

#include <unistd.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "core/version.h"
#include "graph/serialize.h"
#include "io/mmap_file.h"

namespace kiln {

using nlohmann::json;

namespace {

constexpr size_t kFixedHeader = 24;
constexpr size_t kAlign = 64;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

uint64_t fnv1a64(const char* data, size_t n) {
  uint64_t h = 1469598103934665603ull;
  for (size_t i = 0; i < n; ++i) {
    h ^= static_cast<unsigned char>(data[i]);
    h *= 1099511628211ull;
  }
  return h;
}

std::string_view tokenizer_kind_name(TokenizerKind k) {
  switch (k) {
    case TokenizerKind::kSentencePiece:
      return "sentencepiece";
    case TokenizerKind::kByteLevelBpe:
      return "byte_level_bpe";
  }
  return "?";
}

TokenizerKind parse_tokenizer_kind(const std::string& s, const std::string& path) {
  if (s == "sentencepiece") return TokenizerKind::kSentencePiece;
  if (s == "byte_level_bpe") return TokenizerKind::kByteLevelBpe;
  KILN_FAIL("{}: unknown tokenizer kind '{}'", path, s);
}

}  // namespace

void write_plan(const std::string& path, const ModelIR& model, const PlanBuildInfo& info,
                const Logger& log) {
  // Lay out the data section: tokenizer first, then each distinct weight once (graphs share
  // tensors such as T5's shared embedding).
  struct Blob {
    const Tensor* tensor;
    size_t offset;
  };
  std::vector<Blob> blobs;
  std::map<const void*, int> blob_index;
  size_t cursor = align_up(model.tokenizer_bytes.size());
  auto blob_of = [&](const Tensor& t) {
    auto it = blob_index.find(t.raw());
    if (it != blob_index.end() && blobs[it->second].tensor->nbytes() == t.nbytes() &&
        blobs[it->second].tensor->dtype() == t.dtype())
      return it->second;
    const int id = static_cast<int>(blobs.size());
    blobs.push_back({&t, cursor});
    blob_index[t.raw()] = id;
    cursor = align_up(cursor + t.nbytes());
    return id;
  };
  json graphs = json::array();
  for (const Graph& g : model.graphs) graphs.push_back(graph_to_json(g, blob_of));
  json blob_table = json::array();
  for (const Blob& b : blobs)
    blob_table.push_back({{"offset", b.offset},
                          {"bytes", b.tensor->nbytes()},
                          {"dtype", std::string(dtype_name(b.tensor->dtype()))},
                          {"shape", b.tensor->shape()}});
  json sources = json::array();
  for (const std::string& f : info.source_files) {
    auto m = MappedFile::open(f);
    sources.push_back({{"file", f},
                       {"bytes", m->size()},
                       {"fnv1a64", fmt::format("{:016x}", fnv1a64(m->data(), m->size()))}});
  }
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  json header{
      {"kiln_version", version_string()},
      {"git_revision", git_revision()},
      {"created_unix", static_cast<int64_t>(now)},
      {"device", std::string(device_name(info.device))},
      {"precision", std::string(dtype_name(info.precision))},
      {"profiles", {{"max_input_tokens", model.max_input_tokens}}},
      {"source", {{"path", info.source}, {"files", sources}}},
      {"architecture", std::string(architecture_name(model.config.arch))},
      {"config", json::parse(model_config_to_json(model.config))},
      {"prompt_template", model.prompt_template},
      {"tokenizer",
       {{"kind", std::string(tokenizer_kind_name(model.tokenizer_kind))},
        {"offset", 0},
        {"bytes", model.tokenizer_bytes.size()}}},
      {"graphs", graphs},
      {"blobs", blob_table},
  };
  const std::string header_text = header.dump();
  const size_t data_start = align_up(kFixedHeader + header_text.size());

  // Written beside the target and renamed into place, so readers never see a partial plan.
  const std::string tmp = path + ".partial." + std::to_string(getpid());
  std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
  KILN_CHECK(out.good(), "cannot write plan '{}': {}", path, std::strerror(errno));
  out.write(kPlanMagic, 8);
  const uint32_t version = kPlanFormatVersion, reserved = 0;
  const uint64_t header_len = header_text.size();
  out.write(reinterpret_cast<const char*>(&version), 4);
  out.write(reinterpret_cast<const char*>(&reserved), 4);
  out.write(reinterpret_cast<const char*>(&header_len), 8);
  out.write(header_text.data(), static_cast<std::streamsize>(header_text.size()));
  const std::string zeros(kAlign, '\0');
  auto pad_to = [&](size_t pos) {
    const auto here = static_cast<size_t>(out.tellp());
    if (pos > here) out.write(zeros.data(), static_cast<std::streamsize>(pos - here));
  };
  pad_to(data_start);
  out.write(model.tokenizer_bytes.data(),
            static_cast<std::streamsize>(model.tokenizer_bytes.size()));
  for (const Blob& b : blobs) {
    pad_to(data_start + b.offset);
    KILN_CHECK(b.tensor->is_contiguous(), "plan writer: weight is not contiguous");
    out.write(static_cast<const char*>(b.tensor->raw()),
              static_cast<std::streamsize>(b.tensor->nbytes()));
  }
  out.close();
  KILN_CHECK(!out.fail(), "writing plan '{}' failed (disk full?)", path);
  KILN_CHECK(std::rename(tmp.c_str(), path.c_str()) == 0, "cannot rename {} to {}: {}", tmp, path,
             std::strerror(errno));
  log.info("wrote plan {}: {} graphs, {} weight blobs, {:.1f} MiB", path, model.graphs.size(),
           blobs.size(), static_cast<double>(data_start + cursor) / (1 << 20));
}

namespace {

json read_header(const MappedFile& file, size_t* data_start) {
  const std::string& path = file.path();
  KILN_CHECK(file.size() >= kFixedHeader, "{}: not a kiln plan (file is only {} bytes)", path,
             file.size());
  KILN_CHECK(std::memcmp(file.data(), kPlanMagic, 8) == 0,
             "{}: not a kiln plan (bad magic; expected a file written by `kiln build`)", path);
  uint32_t version, reserved;
  uint64_t header_len;
  std::memcpy(&version, file.data() + 8, 4);
  std::memcpy(&reserved, file.data() + 12, 4);
  std::memcpy(&header_len, file.data() + 16, 8);
  KILN_CHECK(version == kPlanFormatVersion,
             "{}: plan format version {}, but this kiln ({}) reads version {}; rebuild the plan "
             "with this kiln's `kiln build`",
             path, version, version_string(), kPlanFormatVersion);
  KILN_CHECK(reserved == 0, "{}: corrupt plan (reserved header bytes are {:#x}, expected 0)", path,
             reserved);
  KILN_CHECK(header_len <= file.size() - kFixedHeader,
             "{}: truncated plan (header of {} bytes, file has {})", path, header_len, file.size());
  *data_start = align_up(kFixedHeader + header_len);
  try {
    return json::parse(file.data() + kFixedHeader, file.data() + kFixedHeader + header_len);
  } catch (const json::exception& e) {
    KILN_FAIL("{}: corrupt plan header: {}", path, e.what());
  }
}

}  // namespace

std::string read_plan_metadata_json(const std::string& path) {
  auto file = MappedFile::open(path);
  size_t data_start;
  json h = read_header(*file, &data_start);
  h.erase("graphs");
  h.erase("blobs");
  return h.dump(2);
}

ModelIR read_plan(const std::string& path, const Logger& log) {
  std::shared_ptr<MappedFile> file = MappedFile::open(path);
  size_t data_start;
  const json h = read_header(*file, &data_start);
  KILN_CHECK(data_start <= file->size(), "{}: truncated plan (no data section)", path);
  const size_t data_size = file->size() - data_start;
  const char* data = file->data() + data_start;
  ModelIR model;
  try {
    const std::string device = h.at("device").get<std::string>();
    KILN_CHECK(device == "cpu",
               "{}: plan was built for device '{}'; this engine runs cpu plans — rebuild with "
               "`kiln build --device cpu`",
               path, device);
    const std::string precision = h.at("precision").get<std::string>();
    KILN_CHECK(precision == "f32", "{}: plan precision '{}' is not supported by this kiln", path,
               precision);
    model.config = parse_model_config(h.at("config").dump(), path + " (config)");
    model.prompt_template = h.at("prompt_template").get<std::string>();
    model.max_input_tokens = h.at("profiles").at("max_input_tokens").get<int64_t>();
    KILN_CHECK(model.max_input_tokens > 0, "{}: invalid max_input_tokens", path);
    const json& tok = h.at("tokenizer");
    model.tokenizer_kind = parse_tokenizer_kind(tok.at("kind").get<std::string>(), path);
    const size_t tok_off = tok.at("offset").get<size_t>(), tok_len = tok.at("bytes").get<size_t>();
    KILN_CHECK(tok_off <= data_size && tok_len <= data_size - tok_off,
               "{}: truncated plan (tokenizer at {}+{} past the end)", path, tok_off, tok_len);
    model.tokenizer_bytes.assign(data + tok_off, tok_len);

    std::vector<Tensor> blobs;
    for (const json& b : h.at("blobs")) {
      const size_t off = b.at("offset").get<size_t>(), bytes = b.at("bytes").get<size_t>();
      const DType dtype = parse_dtype(b.at("dtype").get<std::string>());
      const Shape shape = b.at("shape").get<Shape>();
      for (int64_t d : shape)
        KILN_CHECK(d >= 0, "{}: blob {} has a negative dimension", path, blobs.size());
      KILN_CHECK(off % kAlign == 0, "{}: blob {} is not 64-byte aligned", path, blobs.size());
      KILN_CHECK(off <= data_size && bytes <= data_size - off,
                 "{}: truncated plan (weight blob {} at {}+{} past the end of {} data bytes)", path,
                 blobs.size(), off, bytes, data_size);
      size_t expect = dtype_bytes(dtype, 1);
      for (int64_t d : shape) {
        KILN_CHECK(d == 0 || expect <= SIZE_MAX / static_cast<size_t>(d),
                   "{}: blob {} shape overflows", path, blobs.size());
        expect *= static_cast<size_t>(d);
      }
      KILN_CHECK(expect == bytes, "{}: blob {} holds {} bytes but {} {} needs {}", path,
                 blobs.size(), bytes, dtype_name(dtype), shape_str(shape), expect);
      blobs.push_back(Tensor::view(dtype, shape, data + off, file));
    }
    auto tensor_of = [&](int i) {
      KILN_CHECK(i >= 0 && i < static_cast<int>(blobs.size()), "{}: weight refers to blob {} of {}",
                 path, i, blobs.size());
      return blobs[i];
    };
    for (const json& g : h.at("graphs"))
      model.graphs.push_back(graph_from_json(g, tensor_of, path));
  } catch (const json::exception& e) {
    KILN_FAIL("{}: corrupt plan header: {}", path, e.what());
  }
  KILN_CHECK(model.has_graph(kDecoderGraph), "{}: plan has no decoder graph", path);
  KILN_CHECK(!model.is_encoder_decoder() || model.has_graph(kEncoderGraph),
             "{}: encoder-decoder plan has no encoder graph", path);
  log.info("loaded plan {} ({} {}, {:.1f} MiB mapped, weights not copied)", path,
           architecture_name(model.config.arch), h.value("precision", "?"),
           static_cast<double>(file->size()) / (1 << 20));
  return model;
}

}  // namespace kiln
