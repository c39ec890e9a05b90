// A read-only memory mapping of a whole file, shared by the tensors that view into it.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

namespace kiln {

class MappedFile {
 public:
  // Throws kiln::Error naming the path when the file is missing or cannot be mapped.
  static std::shared_ptr<MappedFile> open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const char* data() const { return static_cast<const char*>(data_); }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile() = default;
  void* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

// Reads a whole (small) file into a string; throws naming the path on failure.
std::string read_text_file(const std::string& path);

}  // namespace kiln
