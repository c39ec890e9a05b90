// Writing a file so that readers never see a partial one: the bytes go to a temporary file
// beside the target, which is renamed over it only when every write and the close succeeded.
// Existing mappings of the old file stay valid (the rename replaces the directory entry, not the
// inode). On any failure the temporary file is removed and the error names the target; so it is
// when the process is interrupted (SIGINT, SIGTERM, SIGHUP, if their action was the default).
#pragma once

#include <cstdio>
#include <string>

namespace kiln {

class AtomicFileWriter {
 public:
  // Creates PATH.partial.PID; throws naming `path` when it cannot.
  explicit AtomicFileWriter(std::string path);
  ~AtomicFileWriter();  // removes the temporary file unless commit() succeeded
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t bytes);
  // Writes zero bytes up to absolute offset `pos` (no-op when already there).
  void pad_to(size_t pos);
  size_t position() const { return position_; }
  // Flushes, closes and renames into place; throws naming the target on failure.
  void commit();

  // Checks up front that `path` can be the target of a write: not empty, not a directory or
  // another non-regular file (a device, a pipe), its directory exists (a usage error naming
  // what is wrong), and a file can be created there (tried with the temporary file's name,
  // removed at once; a runtime error otherwise).
  static void check_target(const std::string& path, const char* what);

 private:
  [[noreturn]] void fail(const char* action, int error);

  std::string path_;
  std::string tmp_;
  std::FILE* file_ = nullptr;
  size_t position_ = 0;
  bool committed_ = false;
  int slot_ = -1;  // in the interrupt handler's list of temporary files
};

}  // namespace kiln
