// safetensors checkpoints: one file, or shards listed by model.safetensors.index.json. Tensors
// are views into the mmapped files (no copy). Every header field is validated: header length,
// JSON, dtype, shape vs byte count, offsets inside the file, tensors not overlapping.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "io/mmap_file.h"

namespace kiln {

class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::string& path);
  const std::string& path() const { return path_; }
  const std::map<std::string, Tensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::string path_;
  std::shared_ptr<MappedFile> file_;
  std::map<std::string, Tensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a checkpoint directory: model.safetensors, or the shards of
// model.safetensors.index.json (each tensor from the shard the index names).
class Checkpoint {
 public:
  static Checkpoint open_dir(const std::string& dir);
  // Tensors already in memory under the checkpoint's names (a lifted ONNX graph's weights);
  // `source` names them in errors.
  static Checkpoint from_tensors(std::string source, std::map<std::string, Tensor> tensors);
  bool has(const std::string& name) const { return tensors_.count(name) != 0; }
  // Throws naming the checkpoint and the tensor when it is missing.
  const Tensor& get(const std::string& name) const;
  // get() plus a shape check; the error names the tensor, the expected and the found shape.
  const Tensor& get(const std::string& name, const Shape& expected) const;
  const std::map<std::string, Tensor>& tensors() const { return tensors_; }
  const std::string& dir() const { return dir_; }
  // Files the tensors came from (for build metadata hashes).
  const std::vector<std::string>& files() const { return files_; }

 private:
  std::string dir_;
  std::vector<std::string> files_;
  std::map<std::string, Tensor> tensors_;
};

// 16 hex digits over every tensor of the checkpoint, in name order: its name, dtype, shape and
// bytes (the files' names and layout do not count: a resharded copy has the same digest). What
// names a checkpoint's content (calibration caches are checked against it). Reads every byte
// once, releasing the pages as it goes.
std::string checkpoint_digest(const Checkpoint& checkpoint);

// A tensor to write without holding it in memory: `fill(first, count, dst)` produces elements
// [first, first + count) of it in its dtype (count is a whole number of blocks).
struct TensorSource {
  std::string name;
  DType dtype;
  Shape shape;
  std::function<void(int64_t first, int64_t count, void* dst)> fill;
};
// Writes a safetensors file from sources, in the given order, a bounded chunk at a time (a
// multi-gigabyte checkpoint never sits in memory); `progress(bytes_written, total)` is called
// after each chunk. Atomic: a temporary file is renamed into place.
void write_safetensors_streaming(const std::string& path, const std::vector<TensorSource>& sources,
                                 const std::map<std::string, std::string>& metadata,
                                 const std::function<void(int64_t, int64_t)>& progress);

// Writes tensors to a safetensors file (used by tests to make corrupt/sharded inputs and by
// tools that export). Tensors are written in name order.
void write_safetensors(const std::string& path, const std::map<std::string, Tensor>& tensors,
                       const std::map<std::string, std::string>& metadata = {});

}  // namespace kiln
