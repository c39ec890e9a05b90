#include "plan/plan.h"

#include <chrono>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "core/version.h"
#include "graph/packing.h"
#include "graph/serialize.h"
#include "io/atomic_file.h"
#include "io/hash.h"
#include "io/mmap_file.h"
#include "plan/plan_json.h"

namespace kiln {

using nlohmann::json;

namespace {

constexpr size_t kAlign = 64;

size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

uint64_t section_checksum(const std::string& header, const char* tokenizer, size_t tokenizer_len) {
  return hash64(tokenizer, tokenizer_len, hash64(header.data(), header.size()));
}

}  // namespace

void write_plan(const std::string& path, const ModelIR& model, const PlanBuildInfo& info,
                const Logger& log) {
  AtomicFileWriter::check_target(path, "plan");
  // Lay out the data section: tokenizer first, then each distinct weight once. Graphs share
  // tensors (T5's shared embedding) and checkpoints repeat contents; deduplication keys on the
  // bytes themselves (hash, then an exact comparison), with dtype, shape and layout.
  struct Blob {
    const Value* value;
    size_t offset;
    uint64_t hash;
  };
  std::vector<Blob> blobs;
  std::multimap<uint64_t, int> by_hash;
  size_t cursor = align_up(model.tokenizer_bytes.size());
  auto blob_of = [&](const Value& v) {
    const Tensor& t = v.data;
    KILN_CHECK(t.is_contiguous() && t.device() == Device::kCpu,
               "plan writer: weight '{}' is not a contiguous host tensor", v.name);
    // A build's weights are file mappings (the checkpoint, the spill file): their pages are
    // released once read, so that writing the plan does not make the model resident.
    const uint64_t h =
        t.file_backed() ? hash64_releasing(t.raw(), t.nbytes()) : hash64(t.raw(), t.nbytes());
    auto [lo, hi] = by_hash.equal_range(h);
    for (auto it = lo; it != hi; ++it) {
      const Value& other = *blobs[it->second].value;
      const bool same = other.data.dtype() == t.dtype() && other.data.shape() == t.shape() &&
                        other.layout == v.layout &&
                        std::memcmp(other.data.raw(), t.raw(), t.nbytes()) == 0;
      other.data.release_pages();
      t.release_pages();
      if (same) return it->second;
    }
    const int id = static_cast<int>(blobs.size());
    blobs.push_back({&v, cursor, h});
    by_hash.emplace(h, id);
    cursor = align_up(cursor + t.nbytes());
    return id;
  };
  json graphs = json::array();
  for (const Graph& g : model.graphs) graphs.push_back(graph_to_json(g, blob_of));
  json blob_table = json::array();
  for (const Blob& b : blobs)
    blob_table.push_back({{"offset", b.offset},
                          {"bytes", b.value->data.nbytes()},
                          {"dtype", dtype_name(b.value->data.dtype())},
                          {"shape", b.value->data.shape()},
                          {"layout", layout_to_json(b.value->layout)},
                          {"hash", hash_hex(b.hash)}});
  json sources = json::array();
  for (const std::string& f : info.source_files) {
    auto m = MappedFile::open(f);
    sources.push_back({{"file", f},
                       {"bytes", m->size()},
                       {"hash64", hash_hex(hash64_releasing(m->data(), m->size()))}});
  }
  json notes = json::array();
  for (const PrecisionNote& n : model.precision_notes) {
    notes.push_back({{"graph", n.graph}, {"weight", n.weight}, {"reason", n.reason}});
    if (!n.node.empty()) notes.back()["node"] = n.node;
  }
  const auto now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  json header{
      {"kiln_version", version_string()},
      {"git_revision", git_revision()},
      {"created_unix", static_cast<int64_t>(now)},
      {"device", device_name(model.device)},
      {"precision", precision_name(model.precision)},
      {"precision_notes", notes},
      {"kv_cache", kv_cache_name(model.kv_cache)},
      {"profile", profile_to_json(model.profile)},
      {"source", {{"path", info.source}, {"files", sources}}},
      {"architecture", model.desc.architecture},
      {"model", desc_to_json(model.desc)},
      {"source_config",
       json::parse(model.source_config_json.empty() ? "{}" : model.source_config_json)},
      {"prompt_template", model.prompt_template},
      {"tokenizer",
       {{"format", model.tokenizer_format},
        {"offset", 0},
        {"bytes", model.tokenizer_bytes.size()},
        {"pieces", model.tokenizer_pieces}}},
      {"graphs", graphs},
      {"blobs", blob_table},
  };
  if (!model.target.empty()) header["target"] = model.target;
  if (!model.weights_digest.empty()) header["weights_digest"] = model.weights_digest;
  const std::string header_text = header.dump();
  const size_t data_start = align_up(kPlanFixedHeader + header_text.size());
  const uint64_t checksum =
      section_checksum(header_text, model.tokenizer_bytes.data(), model.tokenizer_bytes.size());

  AtomicFileWriter out(path);
  out.write(kPlanMagic, 8);
  const uint32_t version = kPlanFormatVersion, reserved = 0;
  const uint64_t header_len = header_text.size();
  out.write(&version, 4);
  out.write(&reserved, 4);
  out.write(&header_len, 8);
  out.write(&checksum, 8);
  out.write(header_text.data(), header_text.size());
  out.pad_to(data_start);
  out.write(model.tokenizer_bytes.data(), model.tokenizer_bytes.size());
  for (const Blob& b : blobs) {
    out.pad_to(data_start + b.offset);
    out.write(b.value->data.raw(), b.value->data.nbytes());
    b.value->data.release_pages();
  }
  out.commit();
  log.info("wrote plan {}: {} graphs, {} weight blobs, {:.1f} MiB", path, model.graphs.size(),
           blobs.size(), static_cast<double>(data_start + cursor) / (1 << 20));
}

namespace {

struct Header {
  json doc;
  size_t data_start = 0;
};

Header read_header(const MappedFile& file) {
  const std::string& path = file.path();
  KILN_CHECK(file.size() >= 16, "{}: not a kiln plan (file is only {} bytes)", path, file.size());
  KILN_CHECK(std::memcmp(file.data(), kPlanMagic, 8) == 0,
             "{}: not a kiln plan (bad magic; expected a file written by `kiln build`)", path);
  uint32_t version, reserved;
  std::memcpy(&version, file.data() + 8, 4);
  std::memcpy(&reserved, file.data() + 12, 4);
  KILN_CHECK(version == kPlanFormatVersion,
             "{}: plan format version {}, but this kiln ({}) reads version {}; rebuild the plan "
             "with this kiln's `kiln build`",
             path, version, version_string(), kPlanFormatVersion);
  KILN_CHECK(file.size() >= kPlanFixedHeader, "{}: truncated plan (file is only {} bytes)", path,
             file.size());
  KILN_CHECK(reserved == 0, "{}: corrupt plan (reserved header bytes are {:#x}, expected 0)", path,
             reserved);
  uint64_t header_len, checksum;
  std::memcpy(&header_len, file.data() + 16, 8);
  std::memcpy(&checksum, file.data() + 24, 8);
  KILN_CHECK(header_len <= file.size() - kPlanFixedHeader,
             "{}: truncated plan (header of {} bytes, file has {})", path, header_len, file.size());
  Header h;
  h.data_start = align_up(kPlanFixedHeader + header_len);
  KILN_CHECK(h.data_start <= file.size(), "{}: truncated plan (no data section)", path);
  const std::string text(file.data() + kPlanFixedHeader, header_len);
  try {
    h.doc = json::parse(text);
    const json& tok = h.doc.at("tokenizer");
    const size_t off = tok.at("offset").get<size_t>(), len = tok.at("bytes").get<size_t>();
    const size_t data_size = file.size() - h.data_start;
    KILN_CHECK(off <= data_size && len <= data_size - off,
               "{}: truncated plan (tokenizer at {}+{} past the end)", path, off, len);
    KILN_CHECK(section_checksum(text, file.data() + h.data_start + off, len) == checksum,
               "{}: corrupt plan: the header or tokenizer bytes do not match the plan's checksum "
               "(the file was modified or damaged after `kiln build`; rebuild it)",
               path);
  } catch (const json::exception& e) {
    KILN_FAIL("{}: corrupt plan header: {}", path, e.what());
  }
  return h;
}

}  // namespace

std::string read_plan_metadata_json(const std::string& path) {
  auto file = MappedFile::open(path);
  json h = read_header(*file).doc;
  h.erase("graphs");
  h.erase("blobs");
  h.erase("precision_notes");  // `kiln inspect` summarises them per graph
  return h.dump(2);
}

ModelIR read_plan(const std::string& path, const Logger& log) {
  std::shared_ptr<MappedFile> file = MappedFile::open(path);
  const Header header = read_header(*file);
  const json& h = header.doc;
  const size_t data_size = file->size() - header.data_start;
  const char* data = file->data() + header.data_start;
  ModelIR model;
  try {
    const std::string device = h.at("device").get<std::string>();
    KILN_CHECK(parse_device(device, &model.device), "{}: unknown device '{}' (known: {})", path,
               device, device_names());
    const std::string precision = h.at("precision").get<std::string>();
    KILN_CHECK(parse_precision(precision, &model.precision),
               "{}: unknown precision '{}' (known: {})", path, precision, precision_names());
    // Plans written before the precision pass existed have no notes (they are fp32).
    if (h.contains("precision_notes"))
      for (const json& n : h.at("precision_notes"))
        model.precision_notes.push_back(
            {n.at("graph").get<std::string>(), n.at("weight").get<std::string>(),
             n.at("reason").get<std::string>(), n.value("node", std::string())});
    // Plans written before --kv-cache existed keep the attention's own type.
    if (h.contains("kv_cache")) {
      const std::string kv = h.at("kv_cache").get<std::string>();
      KILN_CHECK(parse_kv_cache(kv, &model.kv_cache),
                 "{}: unknown kv_cache '{}' (known: auto, fp8)", path, kv);
      const std::string_view refusal = kv_cache_refusal(model.device, model.kv_cache);
      KILN_CHECK(refusal.empty(), "{}: a {} plan with kv_cache {}: {}", path,
                 device_name(model.device), kv, refusal);
    }
    // Plans written before targets were recorded run anywhere their device does.
    if (h.contains("target")) model.target = h.at("target").get<std::string>();
    // Plans written before the digest was recorded have none (they cannot be calibrated).
    if (h.contains("weights_digest"))
      model.weights_digest = h.at("weights_digest").get<std::string>();
    model.desc = desc_from_json(h.at("model"), path + " (model)");
    model.profile = profile_from_json(h.at("profile"), path + " (profile)");
    model.source_config_json = h.at("source_config").dump(2);
    model.prompt_template = h.at("prompt_template").get<std::string>();
    const json& tok = h.at("tokenizer");
    model.tokenizer_format = tok.at("format").get<std::string>();
    model.tokenizer_bytes.assign(data + tok.at("offset").get<size_t>(),
                                 tok.at("bytes").get<size_t>());
    model.tokenizer_pieces = tok.at("pieces").get<int64_t>();
    KILN_CHECK(model.tokenizer_pieces > 0, "{}: the plan's tokenizer records {} pieces", path,
               model.tokenizer_pieces);

    struct Blob {
      Tensor tensor;
      WeightLayout layout;
    };
    std::vector<Blob> blobs;
    for (const json& b : h.at("blobs")) {
      const size_t off = b.at("offset").get<size_t>(), bytes = b.at("bytes").get<size_t>();
      const DType dtype = parse_dtype(b.at("dtype").get<std::string>());
      const Shape shape = b.at("shape").get<Shape>();
      for (int64_t d : shape)
        KILN_CHECK(d > 0, "{}: blob {} has dimension {} (every dimension must be positive)", path,
                   blobs.size(), d);
      KILN_CHECK(off % kAlign == 0, "{}: blob {} is not 64-byte aligned", path, blobs.size());
      KILN_CHECK(off <= data_size && bytes <= data_size - off,
                 "{}: truncated plan (weight blob {} at {}+{} past the end of {} data bytes)", path,
                 blobs.size(), off, bytes, data_size);
      // Elements first, then bytes: a block type (i4: two elements a byte) holds whole blocks.
      size_t elems = 1;
      for (int64_t d : shape) {
        KILN_CHECK(elems <= (SIZE_MAX / 8) / static_cast<size_t>(d), "{}: blob {} shape overflows",
                   path, blobs.size());
        elems *= static_cast<size_t>(d);
      }
      const DTypeTraits& traits = dtype_traits(dtype);
      KILN_CHECK(elems % static_cast<size_t>(traits.block_elems) == 0,
                 "{}: blob {} is {} {}, which is not a whole number of {}-element blocks", path,
                 blobs.size(), dtype_name(dtype), shape_str(shape), traits.block_elems);
      const size_t expect = dtype_bytes(dtype, elems);
      KILN_CHECK(expect == bytes, "{}: blob {} holds {} bytes but {} {} needs {}", path,
                 blobs.size(), bytes, dtype_name(dtype), shape_str(shape), expect);
      const std::string blob_name = path + " blob " + std::to_string(blobs.size());
      Blob blob{Tensor::view(dtype, shape, data + off, file),
                layout_from_json(b.at("layout"), blob_name)};
      const std::string problem = packed_layout_problem(blob.layout, dtype, shape);
      KILN_CHECK(problem.empty(), "{}: {}; rebuild the plan on this machine", blob_name, problem);
      blobs.push_back(std::move(blob));
    }
    auto bind_blob = [&](int i, Value& v) {
      KILN_CHECK(i >= 0 && i < static_cast<int>(blobs.size()),
                 "{}: weight '{}' refers to blob {} of {}", path, v.name, i, blobs.size());
      v.data = blobs[i].tensor;
      v.layout = blobs[i].layout;
    };
    for (const json& g : h.at("graphs"))
      model.graphs.push_back(graph_from_json(g, bind_blob, path));
  } catch (const json::exception& e) {
    KILN_FAIL("{}: corrupt plan header: {}", path, e.what());
  }
  check_model_contract(model, path);
  log.info("loaded plan {} ({} {}, {:.1f} MiB mapped, weights not copied)", path,
           model.desc.architecture, precision_name(model.precision),
           static_cast<double>(file->size()) / (1 << 20));
  return model;
}

std::vector<std::string> verify_plan_weights(const std::string& path) {
  auto file = MappedFile::open(path);
  const Header header = read_header(*file);
  std::vector<std::string> bad;
  const size_t data_size = file->size() - header.data_start;
  try {
    size_t i = 0;
    for (const json& b : header.doc.at("blobs")) {
      const size_t off = b.at("offset").get<size_t>(), bytes = b.at("bytes").get<size_t>();
      if (off > data_size || bytes > data_size - off) {
        bad.push_back(fmt::format("blob {}: {}+{} lies past the end of the file", i, off, bytes));
      } else {
        const std::string want = b.at("hash").get<std::string>();
        const std::string got = hash_hex(hash64(file->data() + header.data_start + off, bytes));
        if (got != want)
          bad.push_back(
              fmt::format("blob {} ({} bytes at data offset {}): hash {} but the plan "
                          "recorded {}",
                          i, bytes, off, got, want));
      }
      ++i;
    }
  } catch (const json::exception& e) {
    KILN_FAIL("{}: corrupt plan header: {}", path, e.what());
  }
  return bad;
}

}  // namespace kiln
