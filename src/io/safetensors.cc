#include "io/safetensors.h"

#include "io/atomic_file.h"
#include "io/hash.h"

#include "io/json_util.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <system_error>

#include "core/status.h"

namespace kiln {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// The reference implementation (huggingface/safetensors) refuses headers above 100 MB; a
// larger length is a corrupt file, not a big model.
constexpr uint64_t kMaxHeaderBytes = 100'000'000;
constexpr const char* kMetadataKey = "__metadata__";
constexpr const char* kSingleFile = "model.safetensors";
constexpr const char* kIndexFile = "model.safetensors.index.json";

uint64_t read_le_u64(const char* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | static_cast<unsigned char>(p[i]);
  return v;
}

void write_le_u64(uint64_t v, char* p) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<char>((v >> (8 * i)) & 0xff);
}

std::string supported_dtypes() {
  std::string names;
  for (int i = 0; i < kNumDTypes; ++i) {
    const std::string_view name = dtype_traits(static_cast<DType>(i)).safetensors;
    if (name.empty()) continue;  // kiln-only formats never appear in checkpoints
    if (!names.empty()) names += ", ";
    names += name;
  }
  return names;
}

// A non-negative JSON integer that fits in uint64_t (nlohmann stores large positive values as
// unsigned, negative ones as signed, and anything with a fraction or exponent as float).
bool as_u64(const json& v, uint64_t* out) {
  if (v.is_number_unsigned()) {
    *out = v.get<uint64_t>();
    return true;
  }
  if (v.is_number_integer() && v.get<int64_t>() >= 0) {
    *out = static_cast<uint64_t>(v.get<int64_t>());
    return true;
  }
  return false;
}

struct ByteRange {
  uint64_t begin;
  uint64_t end;
  const std::string* name;
};

// Validates one tensor entry and makes its tensor; `range` receives the bytes it claims
// (relative to the data section) for the overlap check. Everything is checked before a Tensor
// is made, so that a hostile header fails here with the file and tensor named rather than deep
// inside Tensor's own checks.
Tensor parse_entry(const std::string& path, const std::string& name, const json& entry,
                   const char* data, uint64_t data_bytes, const std::shared_ptr<MappedFile>& owner,
                   ByteRange* range) {
  KILN_CHECK(entry.is_object(), "{}: tensor '{}': header entry must be a JSON object, got {}", path,
             name, entry.type_name());

  const auto dtype_it = entry.find("dtype");
  KILN_CHECK(dtype_it != entry.end(), "{}: tensor '{}': missing 'dtype'", path, name);
  KILN_CHECK(dtype_it->is_string(), "{}: tensor '{}': 'dtype' must be a string, got {}", path, name,
             brief_json(*dtype_it));
  const std::string dtype_str = dtype_it->get<std::string>();
  DType dtype;
  KILN_CHECK(try_parse_safetensors_dtype(dtype_str, &dtype),
             "{}: tensor '{}': unsupported dtype '{}' (supported: {})", path, name, dtype_str,
             supported_dtypes());

  const auto shape_it = entry.find("shape");
  KILN_CHECK(shape_it != entry.end(), "{}: tensor '{}': missing 'shape'", path, name);
  KILN_CHECK(shape_it->is_array(), "{}: tensor '{}': 'shape' must be an array, got {}", path, name,
             brief_json(*shape_it));
  // Tensor's stride computation multiplies dimensions in int64_t from the innermost one, so the
  // product of the non-zero dimensions (which bounds every partial product) must fit in int64_t
  // even when a zero makes the tensor empty.
  constexpr auto kMaxI64 = static_cast<uint64_t>(std::numeric_limits<int64_t>::max());
  Shape shape;
  uint64_t nonzero_product = 1;
  bool overflow = false;
  bool empty = false;
  for (const json& d : *shape_it) {
    uint64_t dim = 0;
    KILN_CHECK(as_u64(d, &dim) && dim <= kMaxI64,
               "{}: tensor '{}': shape {} has a dimension {} that is not a non-negative integer",
               path, name, brief_json(*shape_it), brief_json(d));
    shape.push_back(static_cast<int64_t>(dim));
    empty = empty || dim == 0;
    if (dim != 0) {
      overflow = overflow || __builtin_mul_overflow(nonzero_product, dim, &nonzero_product) ||
                 nonzero_product > kMaxI64;
    }
  }
  const uint64_t numel = empty ? 0 : nonzero_product;

  const DTypeTraits& traits = dtype_traits(dtype);
  const auto block_elems = static_cast<uint64_t>(traits.block_elems);
  const auto block_bytes = static_cast<uint64_t>(traits.block_bytes);
  uint64_t expected_bytes = 0;
  overflow = overflow || __builtin_mul_overflow(numel / block_elems, block_bytes, &expected_bytes);
  KILN_CHECK(!overflow, "{}: tensor '{}': shape {} is too large (element count overflows)", path,
             name, brief_json(*shape_it));
  KILN_CHECK(numel % block_elems == 0,
             "{}: tensor '{}': {} elements is not a whole number of {}-element {} blocks", path,
             name, numel, block_elems, dtype_str);

  const auto offsets_it = entry.find("data_offsets");
  KILN_CHECK(offsets_it != entry.end(), "{}: tensor '{}': missing 'data_offsets'", path, name);
  uint64_t begin = 0;
  uint64_t end = 0;
  KILN_CHECK(offsets_it->is_array() && offsets_it->size() == 2 &&
                 as_u64((*offsets_it)[0], &begin) && as_u64((*offsets_it)[1], &end),
             "{}: tensor '{}': 'data_offsets' must be [begin, end] with non-negative integers, got "
             "{}",
             path, name, brief_json(*offsets_it));
  KILN_CHECK(begin <= end, "{}: tensor '{}': data_offsets [{}, {}] has begin after end", path, name,
             begin, end);
  KILN_CHECK(end <= data_bytes,
             "{}: tensor '{}': data_offsets [{}, {}] run past the end of the data section ({} "
             "bytes; the file is truncated or the header is corrupt)",
             path, name, begin, end, data_bytes);
  KILN_CHECK(end - begin == expected_bytes,
             "{}: tensor '{}': {} {} needs {} bytes but data_offsets [{}, {}] span {} bytes", path,
             name, dtype_str, shape_str(shape), expected_bytes, begin, end, end - begin);

  *range = {begin, end, &name};
  const char* ptr = data + begin;
  // Writers that follow the format keep every tensor aligned to its element size; a file that
  // does not is still valid, and typed access to misaligned memory is undefined, so such a
  // tensor (rare) gets an owned copy instead of a view.
  const auto align = static_cast<uintptr_t>(std::min<uint64_t>(block_bytes, 8));
  if (align > 1 && reinterpret_cast<uintptr_t>(ptr) % align != 0) {
    Tensor copy = Tensor::empty(dtype, std::move(shape));
    if (expected_bytes > 0) std::memcpy(copy.raw(), ptr, expected_bytes);
    return copy;
  }
  return Tensor::mapped(dtype, std::move(shape), ptr, owner);
}

void check_no_overlap(const std::string& path, std::vector<ByteRange> ranges) {
  // Empty tensors occupy no bytes and cannot overlap anything.
  std::erase_if(ranges, [](const ByteRange& r) { return r.begin == r.end; });
  std::sort(ranges.begin(), ranges.end(), [](const ByteRange& a, const ByteRange& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < ranges.size(); ++i) {
    const ByteRange& prev = ranges[i - 1];
    const ByteRange& cur = ranges[i];
    KILN_CHECK(cur.begin >= prev.end,
               "{}: tensors '{}' (bytes [{}, {})) and '{}' (bytes [{}, {})) overlap", path,
               *prev.name, prev.begin, prev.end, *cur.name, cur.begin, cur.end);
  }
}

json parse_json_or_fail(const char* begin, const char* end, const std::string& what) {
  try {
    return json::parse(begin, end);
  } catch (const json::exception& e) {
    KILN_FAIL("{}: invalid JSON: {}", what, e.what());
  }
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile out;
  out.path_ = path;
  out.file_ = MappedFile::open(path);
  const size_t size = out.file_->size();
  KILN_CHECK(size >= 8,
             "{}: not a safetensors file: {} bytes, too short for the 8-byte header length", path,
             size);
  const char* bytes = out.file_->data();
  const uint64_t header_len = read_le_u64(bytes);
  KILN_CHECK(header_len <= kMaxHeaderBytes,
             "{}: header length {} is absurd (limit {} bytes); not a safetensors file or corrupt",
             path, header_len, kMaxHeaderBytes);
  KILN_CHECK(header_len <= size - 8,
             "{}: header length {} runs past the end of the file ({} bytes); truncated or corrupt",
             path, header_len, size);

  const json header = parse_json_or_fail(bytes + 8, bytes + 8 + header_len,
                                         fmt::format("{}: safetensors header", path));
  KILN_CHECK(header.is_object(), "{}: safetensors header must be a JSON object, got {}", path,
             header.type_name());

  const char* data = bytes + 8 + header_len;
  const uint64_t data_bytes = size - 8 - header_len;
  std::vector<ByteRange> ranges;
  ranges.reserve(header.size());
  for (const auto& [name, entry] : header.items()) {
    if (name == kMetadataKey) {
      if (entry.is_null()) continue;
      KILN_CHECK(entry.is_object(), "{}: '{}' must be an object of strings, got {}", path,
                 kMetadataKey, entry.type_name());
      for (const auto& [key, value] : entry.items()) {
        KILN_CHECK(value.is_string(), "{}: {} entry '{}' must be a string, got {}", path,
                   kMetadataKey, key, brief_json(value));
        out.metadata_[key] = value.get<std::string>();
      }
      continue;
    }
    ByteRange range{};
    Tensor t = parse_entry(path, name, entry, data, data_bytes, out.file_, &range);
    auto [it, inserted] = out.tensors_.emplace(name, std::move(t));
    range.name = &it->first;
    ranges.push_back(range);
  }
  check_no_overlap(path, std::move(ranges));
  return out;
}

namespace {

// Adds every tensor the index assigns to `shard_name`, taken from that shard.
void take_from_shard(const std::string& index_path, const std::string& shard_name,
                     const SafetensorsFile& shard, const std::vector<std::string>& names,
                     std::map<std::string, Tensor>* tensors) {
  for (const std::string& name : names) {
    const auto it = shard.tensors().find(name);
    KILN_CHECK(it != shard.tensors().end(),
               "{}: tensor '{}' is listed in shard '{}', but {} has no such tensor", index_path,
               name, shard_name, shard.path());
    tensors->emplace(name, it->second);
  }
}

}  // namespace

namespace {

// What to say when a directory has no safetensors weights but weights of another format: which
// files, that kiln reads only safetensors, and how to convert PyTorch weights.
std::string other_weight_formats(const std::string& dir) {
  std::vector<std::string> pytorch, other;
  std::error_code ec;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    if (name.ends_with(".bin") || name.ends_with(".pt") || name.ends_with(".pth") ||
        name == "pytorch_model.bin.index.json")
      pytorch.push_back(name);
    else if (name.ends_with(".h5") || name.ends_with(".msgpack") || name.ends_with(".ckpt"))
      other.push_back(name);
  }
  std::sort(pytorch.begin(), pytorch.end());
  std::sort(other.begin(), other.end());
  if (!pytorch.empty()) {
    // The model's own class (from config.json's "architectures"): AutoModel would load and save
    // the model without its head (T5Model has no lm_head).
    return fmt::format(
        ". It has {}: kiln reads only safetensors weights. Convert them once (with PyTorch and "
        "transformers installed), which writes model.safetensors beside them:\n  python -c "
        "\"import transformers as t; d = '{}'; "
        "a = t.AutoConfig.from_pretrained(d).architectures[0]; "
        "getattr(t, a).from_pretrained(d).save_pretrained(d, safe_serialization=True)\"",
        fmt::join(pytorch, ", "), dir);
  }
  if (!other.empty())
    return fmt::format(". It has {}: kiln reads only safetensors weights (model.safetensors)",
                       fmt::join(other, ", "));
  return "";
}

}  // namespace

Checkpoint Checkpoint::open_dir(const std::string& dir) {
  Checkpoint ckpt;
  ckpt.dir_ = dir;
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    KILN_FAIL_KIND(ErrorKind::kNotFound, "checkpoint directory {} does not exist", dir);
  }
  KILN_CHECK(fs::is_directory(dir, ec), "checkpoint {} is not a directory", dir);
  const std::string single = (fs::path(dir) / kSingleFile).string();
  const std::string index = (fs::path(dir) / kIndexFile).string();

  // Same preference as transformers: the single file wins when both are present.
  if (fs::exists(single, ec)) {
    SafetensorsFile file = SafetensorsFile::open(single);
    ckpt.files_.push_back(single);
    ckpt.tensors_ = file.tensors();
    return ckpt;
  }
  if (!fs::exists(index, ec)) {
    KILN_FAIL_KIND(ErrorKind::kNotFound, "checkpoint directory {} has neither {} nor {}{}", dir,
                   kSingleFile, kIndexFile, other_weight_formats(dir));
  }

  const std::string text = read_text_file(index);
  const json doc = parse_json_or_fail(text.data(), text.data() + text.size(), index);
  KILN_CHECK(doc.is_object(), "{}: must be a JSON object, got {}", index, doc.type_name());
  const auto map_it = doc.find("weight_map");
  KILN_CHECK(map_it != doc.end() && map_it->is_object(),
             "{}: missing 'weight_map' object (tensor name -> shard file)", index);
  KILN_CHECK(!map_it->empty(), "{}: 'weight_map' lists no tensors", index);

  std::map<std::string, std::vector<std::string>> names_by_shard;
  for (const auto& [name, shard] : map_it->items()) {
    KILN_CHECK(shard.is_string(),
               "{}: weight_map entry for tensor '{}' must be a file name, got {}", index, name,
               brief_json(shard));
    const std::string shard_name = shard.get<std::string>();
    const fs::path rel(shard_name);
    KILN_CHECK(!shard_name.empty() && rel.is_relative() &&
                   std::find(rel.begin(), rel.end(), fs::path("..")) == rel.end(),
               "{}: shard '{}' for tensor '{}' must be a file inside {}", index, shard_name, name,
               dir);
    names_by_shard[shard_name].push_back(name);
  }

  for (const auto& [shard_name, names] : names_by_shard) {
    const std::string shard_path = (fs::path(dir) / shard_name).string();
    if (!fs::exists(shard_path, ec)) {
      KILN_FAIL_KIND(ErrorKind::kNotFound, "{}: shard '{}' (holding tensor '{}') not found: {}",
                     index, shard_name, names.front(), shard_path);
    }
    // Each shard is mapped once; its tensors keep the mapping alive after `shard` goes away.
    const SafetensorsFile shard = SafetensorsFile::open(shard_path);
    take_from_shard(index, shard_name, shard, names, &ckpt.tensors_);
    ckpt.files_.push_back(shard_path);
  }
  return ckpt;
}

Checkpoint Checkpoint::from_tensors(std::string source, std::map<std::string, Tensor> tensors) {
  Checkpoint ckpt;
  ckpt.dir_ = std::move(source);
  ckpt.tensors_ = std::move(tensors);
  return ckpt;
}

const Tensor& Checkpoint::get(const std::string& name) const {
  const auto it = tensors_.find(name);
  KILN_CHECK(it != tensors_.end(), "checkpoint {}: no tensor named '{}' ({} tensors present)", dir_,
             name, tensors_.size());
  return it->second;
}

const Tensor& Checkpoint::get(const std::string& name, const Shape& expected) const {
  const Tensor& t = get(name);
  KILN_CHECK(t.shape() == expected, "checkpoint {}: tensor {} has shape {}, expected {}", dir_,
             name, shape_str(t.shape()), shape_str(expected));
  return t;
}

void write_safetensors_streaming(const std::string& path, const std::vector<TensorSource>& sources,
                                 const std::map<std::string, std::string>& metadata,
                                 const std::function<void(int64_t, int64_t)>& progress) {
  // ordered_json keeps __metadata__ first, then the tensors in data order.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) meta[k] = v;
    header[kMetadataKey] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const TensorSource& t : sources) {
    KILN_CHECK(t.name != kMetadataKey, "write_safetensors {}: '{}' is reserved for metadata", path,
               kMetadataKey);
    const std::string_view dtype = dtype_traits(t.dtype).safetensors;
    KILN_CHECK(!dtype.empty(),
               "write_safetensors {}: tensor '{}' is {}, which safetensors cannot hold", path,
               t.name, dtype_name(t.dtype));
    KILN_CHECK(!header.contains(t.name), "write_safetensors {}: tensor '{}' twice", path, t.name);
    const uint64_t n = dtype_bytes(t.dtype, static_cast<size_t>(shape_numel(t.shape)));
    header[t.name] = {{"dtype", dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string text;
  try {
    text = header.dump();
  } catch (const nlohmann::ordered_json::exception& e) {  // names or metadata not UTF-8
    KILN_FAIL("write_safetensors {}: cannot encode the header: {}", path, e.what());
  }
  // Pad with spaces (valid JSON whitespace) so the data section starts 8-byte aligned.
  text.append((8 - text.size() % 8) % 8, ' ');
  char len_bytes[8];
  write_le_u64(text.size(), len_bytes);

  AtomicFileWriter out(path);
  out.write(len_bytes, 8);
  out.write(text.data(), text.size());
  // Chunks of about 16 MiB: bounded memory whatever the tensor size.
  constexpr int64_t kChunkBytes = 16 << 20;
  std::vector<char> buffer;
  int64_t written = 0;
  for (const TensorSource& t : sources) {
    const DTypeTraits& tr = dtype_traits(t.dtype);
    const int64_t numel = shape_numel(t.shape);
    const int64_t chunk = std::max<int64_t>(1, kChunkBytes / tr.block_bytes) * tr.block_elems;
    for (int64_t first = 0; first < numel; first += chunk) {
      const int64_t count = std::min(chunk, numel - first);
      const size_t bytes = dtype_bytes(t.dtype, static_cast<size_t>(count));
      buffer.resize(bytes);
      t.fill(first, count, buffer.data());
      out.write(buffer.data(), bytes);
      written += static_cast<int64_t>(bytes);
      if (progress) progress(written, static_cast<int64_t>(offset));
    }
  }
  out.commit();
}

void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata) {
  std::vector<TensorSource> sources;
  for (const auto& [name, t] : tensors) {
    KILN_CHECK(t.defined(), "write_safetensors {}: tensor '{}' is undefined", path, name);
    KILN_CHECK(t.device() == Device::kCpu, "write_safetensors {}: tensor '{}' is on {}", path, name,
               device_name(t.device()));
    KILN_CHECK(t.is_contiguous(), "write_safetensors {}: tensor '{}' is not contiguous", path,
               name);
    const Tensor* src = &t;
    sources.push_back({name, t.dtype(), t.shape(), [src](int64_t first, int64_t count, void* dst) {
                         const size_t skip = dtype_bytes(src->dtype(), static_cast<size_t>(first));
                         std::memcpy(dst, static_cast<const char*>(src->raw()) + skip,
                                     dtype_bytes(src->dtype(), static_cast<size_t>(count)));
                       }});
  }
  write_safetensors_streaming(path, sources, metadata, nullptr);
}

std::string checkpoint_digest(const Checkpoint& checkpoint) {
  constexpr size_t kPiece = size_t{64} << 20;
  Hash64 h;
  auto add = [&](const void* data, size_t bytes) {
    const uint64_t size = bytes;
    h.update(&size, sizeof size);
    h.update(data, bytes);
  };
  for (const auto& [name, t] : checkpoint.tensors()) {
    add(name.data(), name.size());
    const std::string_view dtype = dtype_name(t.dtype());
    add(dtype.data(), dtype.size());
    add(t.shape().data(), t.shape().size() * sizeof(int64_t));
    const char* p = static_cast<const char*>(t.raw());
    const size_t bytes = t.nbytes();
    const uint64_t size = bytes;
    h.update(&size, sizeof size);
    for (size_t done = 0; done < bytes; done += kPiece) {
      const size_t n = std::min(kPiece, bytes - done);
      h.update(p + done, n);
      if (t.file_backed()) release_file_pages(p + done, n);
    }
  }
  return hash_hex(h.digest());
}

}  // namespace kiln
