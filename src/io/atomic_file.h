// Writing a file so that readers never see a partial one: the bytes go to a temporary file
// beside the target, which is renamed over it only when every write and the close succeeded.
// Existing mappings of the old file stay valid (the rename replaces the directory entry, not the
// inode). On any failure the temporary file is removed and the error names the target; so it is
// when the process is interrupted (SIGINT, SIGTERM, SIGHUP, if their action was the default).
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

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

// Writing a directory of files (a checkpoint) so that nobody sees a partial or mixed one: the
// files go into a temporary directory beside the target, DIR.partial.PID, which is renamed to DIR
// only when every file is complete. Two writers of the same DIR at once, an interrupted writer or
// a full disk leave either the old state or one complete directory: the loser of a race fails
// (nothing of it is left), a failure or SIGINT/SIGTERM/SIGHUP removes the temporary directory, and
// only SIGKILL (or a crash) can leave DIR.partial.PID behind, never a partial DIR.
class AtomicDirWriter {
 public:
  enum class Existing : uint8_t {
    kRefuse,   // an existing non-empty DIR is a usage error (at construction and at commit)
    kReplace,  // an existing DIR is replaced whole at commit (the old one is then removed)
  };
  // Checks `dir` (`what` names it in errors, e.g. "-o"; `force_flag` is what the user gives to
  // replace it, e.g. "--force"): not empty, not "." or "..", not a file, and with kRefuse not a
  // non-empty directory; creates its parent directories and the temporary directory.
  AtomicDirWriter(std::string dir, Existing existing, const char* what, const char* force_flag);
  ~AtomicDirWriter();  // removes the temporary directory unless commit() succeeded
  AtomicDirWriter(const AtomicDirWriter&) = delete;
  AtomicDirWriter& operator=(const AtomicDirWriter&) = delete;

  const std::string& dir() const { return dir_; }
  const std::string& temporary_dir() const { return tmp_; }
  // Where to write the file `name` (a plain file name): inside the temporary directory. The
  // name is recorded so that an interrupt removes the file with the directory.
  std::string path_of(const std::string& name);
  // Renames the temporary directory to DIR. kRefuse: fails (usage error) when DIR appeared
  // meanwhile and is not empty. kReplace: swaps the two atomically where the filesystem can
  // (renameat2 RENAME_EXCHANGE), else moves the old DIR aside first; then removes the old one.
  void commit();

  // A usage error naming `what`, `dir` and `force_flag` when `dir` exists and is not an empty
  // directory (the up-front check of kRefuse, before any work).
  static void check_absent_or_empty(const std::string& dir, const char* what,
                                    const char* force_flag);

 private:
  std::string dir_;
  std::string tmp_;
  Existing existing_;
  std::string what_;
  std::string force_flag_;
  bool committed_ = false;
  int slot_ = -1;  // in the interrupt handler's list of temporary directories
};

}  // namespace kiln
