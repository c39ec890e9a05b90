#include "io/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <system_error>

#include "core/status.h"

namespace kiln {

namespace fs = std::filesystem;

namespace {

void check_target_path(const std::string& path, const char* what) {
  KILN_CHECK_USAGE(!path.empty(), "{} path is empty", what);
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  KILN_CHECK_USAGE(!fs::is_directory(st), "{} '{}' is a directory; give a file name", what, path);
  // The rename would replace a device or pipe (say /dev/null) with a regular file.
  KILN_CHECK_USAGE(!fs::exists(st) || fs::is_regular_file(st),
                   "{} '{}' exists and is not a regular file; give a file name", what, path);
  const fs::path parent = fs::path(path).parent_path();
  if (parent.empty()) return;
  KILN_CHECK_USAGE(fs::exists(parent, ec), "{} '{}': directory '{}' does not exist", what, path,
                   parent.string());
  KILN_CHECK_USAGE(fs::is_directory(parent, ec), "{} '{}': '{}' is not a directory", what, path,
                   parent.string());
}

}  // namespace

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)) {
  check_target_path(path_, "output");
  tmp_ = path_ + ".partial." + std::to_string(getpid());
  file_ = std::fopen(tmp_.c_str(), "wb");
  KILN_CHECK(file_ != nullptr, "cannot create {}: {}", tmp_,
             std::generic_category().message(errno));
}

AtomicFileWriter::~AtomicFileWriter() {
  if (file_ != nullptr) std::fclose(file_);
  if (!committed_) std::remove(tmp_.c_str());
}

void AtomicFileWriter::fail(const char* action, int error) {
  if (file_ != nullptr) std::fclose(file_);
  file_ = nullptr;
  std::remove(tmp_.c_str());
  KILN_FAIL("cannot {} {}: {}", action, path_, std::generic_category().message(error));
}

void AtomicFileWriter::write(const void* data, size_t bytes) {
  KILN_CHECK(file_ != nullptr, "write to {} after commit", path_);
  if (bytes == 0) return;
  if (std::fwrite(data, 1, bytes, file_) != bytes) fail("write", errno);
  position_ += bytes;
}

void AtomicFileWriter::pad_to(size_t pos) {
  static const char zeros[4096] = {};
  while (position_ < pos) write(zeros, std::min(sizeof zeros, pos - position_));
}

void AtomicFileWriter::commit() {
  KILN_CHECK(file_ != nullptr, "commit of {} twice", path_);
  // Buffered data reaches the disk (and can fail, e.g. ENOSPC) only at flush/close.
  const bool flushed = std::fflush(file_) == 0;
  const int flush_errno = errno;
  std::FILE* f = file_;
  file_ = nullptr;
  const bool closed = std::fclose(f) == 0;
  if (!flushed || !closed) {
    std::remove(tmp_.c_str());
    KILN_FAIL("cannot write {}: {}", path_,
              std::generic_category().message(flushed ? errno : flush_errno));
  }
  std::error_code ec;
  fs::rename(tmp_, path_, ec);
  if (ec) {
    std::remove(tmp_.c_str());
    KILN_FAIL("cannot rename {} to {}: {}", tmp_, path_, ec.message());
  }
  committed_ = true;
}

void AtomicFileWriter::check_target(const std::string& path, const char* what) {
  check_target_path(path, what);
  // Creating the temporary file is what fails in a read-only or special directory: try it now,
  // before the work that would be lost.
  const std::string probe = path + ".partial." + std::to_string(getpid());
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  const int error = errno;
  KILN_CHECK(fd >= 0, "{} '{}': cannot create a file there: {}", what, path,
             std::generic_category().message(error));
  ::close(fd);
  ::unlink(probe.c_str());
}

}  // namespace kiln
