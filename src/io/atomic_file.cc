#include "io/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <mutex>
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

// Temporary files being written, removed by the SIGINT/SIGTERM/SIGHUP handler (Ctrl-C during a
// build or a synth leaves no PATH.partial.PID behind). Fixed slots of plain chars: the handler
// may only call async-signal-safe functions (unlink, signal, raise) and read lock-free state.
constexpr int kSlots = 16;
constexpr size_t kSlotBytes = 4096;
struct PartialSlot {
  std::atomic<bool> live{false};
  char path[kSlotBytes];
};
PartialSlot g_partials[kSlots];

extern "C" void remove_partials_and_die(int sig) {
  for (PartialSlot& slot : g_partials)
    if (slot.live.load()) ::unlink(slot.path);
  ::signal(sig, SIG_DFL);
  ::raise(sig);
}

// Installed with the first writer, and only over the default action: a program embedding kiln
// with its own handlers keeps them.
void install_cleanup_handlers() {
  static std::once_flag once;
  std::call_once(once, [] {
    for (int sig : {SIGINT, SIGTERM, SIGHUP}) {
      struct sigaction old {};
      if (::sigaction(sig, nullptr, &old) != 0 || old.sa_handler != SIG_DFL) continue;
      struct sigaction act {};
      act.sa_handler = remove_partials_and_die;
      sigemptyset(&act.sa_mask);
      ::sigaction(sig, &act, nullptr);
    }
  });
}

// A slot for `path`, or -1 when all are taken or the path is too long (then only the
// destructor removes the file).
int track_partial(const std::string& path) {
  install_cleanup_handlers();
  if (path.size() >= kSlotBytes) return -1;
  static std::mutex mutex;  // claims only; the handler never takes it
  std::lock_guard<std::mutex> lock(mutex);
  for (int i = 0; i < kSlots; ++i) {
    if (g_partials[i].live.load()) continue;
    std::memcpy(g_partials[i].path, path.c_str(), path.size() + 1);
    g_partials[i].live.store(true);
    return i;
  }
  return -1;
}

void untrack_partial(int slot) {
  if (slot >= 0) g_partials[slot].live.store(false);
}

}  // namespace

AtomicFileWriter::AtomicFileWriter(std::string path) : path_(std::move(path)) {
  check_target_path(path_, "output");
  tmp_ = path_ + ".partial." + std::to_string(getpid());
  slot_ = track_partial(tmp_);
  file_ = std::fopen(tmp_.c_str(), "wb");
  if (file_ == nullptr) {
    const int error = errno;
    untrack_partial(slot_);
    KILN_FAIL("cannot create {}: {}", tmp_, std::generic_category().message(error));
  }
}

AtomicFileWriter::~AtomicFileWriter() {
  if (file_ != nullptr) std::fclose(file_);
  if (!committed_) std::remove(tmp_.c_str());
  untrack_partial(slot_);
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
