#include "io/atomic_file.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
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

// Temporary directories (AtomicDirWriter) with the names of the files written into them: the
// handler unlinks each name, then removes the directory.
constexpr int kDirSlots = 4;
struct PartialDirSlot {
  std::atomic<bool> live{false};
  char path[kSlotBytes];
  char names[kSlotBytes];  // each NUL-terminated, appended by the writer's thread only
  std::atomic<size_t> names_bytes{0};
};
PartialDirSlot g_partial_dirs[kDirSlots];

size_t c_length(const char* s) {  // strlen, kept to what a signal handler may do
  size_t n = 0;
  while (s[n] != '\0') ++n;
  return n;
}

void remove_partial_dir(const PartialDirSlot& slot) {
  char path[2 * kSlotBytes + 2];
  const size_t dir_len = c_length(slot.path);
  const size_t bytes = slot.names_bytes.load();
  for (size_t i = 0; i < bytes;) {
    const char* name = slot.names + i;
    const size_t len = c_length(name);
    std::memcpy(path, slot.path, dir_len);
    path[dir_len] = '/';
    std::memcpy(path + dir_len + 1, name, len + 1);
    ::unlink(path);
    i += len + 1;
  }
  ::rmdir(slot.path);
}

extern "C" void remove_partials_and_die(int sig) {
  for (PartialSlot& slot : g_partials)
    if (slot.live.load()) ::unlink(slot.path);
  for (PartialDirSlot& slot : g_partial_dirs)
    if (slot.live.load()) remove_partial_dir(slot);
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

std::mutex& dir_slot_mutex() {
  static std::mutex mutex;  // claims only; the handler never takes it
  return mutex;
}

int track_partial_dir(const std::string& path) {
  install_cleanup_handlers();
  if (path.size() >= kSlotBytes) return -1;
  std::lock_guard<std::mutex> lock(dir_slot_mutex());
  for (int i = 0; i < kDirSlots; ++i) {
    PartialDirSlot& slot = g_partial_dirs[i];
    if (slot.live.load()) continue;
    std::memcpy(slot.path, path.c_str(), path.size() + 1);
    slot.names_bytes.store(0);
    slot.live.store(true);
    return i;
  }
  return -1;
}

// Records `name` in the slot (when it fits; the destructor removes the directory anyway).
void track_partial_name(int slot, const std::string& name) {
  if (slot < 0) return;
  PartialDirSlot& s = g_partial_dirs[slot];
  const size_t at = s.names_bytes.load();
  if (at + name.size() + 1 > kSlotBytes) return;
  std::memcpy(s.names + at, name.c_str(), name.size() + 1);
  s.names_bytes.store(at + name.size() + 1);
}

void untrack_partial_dir(int slot) {
  if (slot >= 0) g_partial_dirs[slot].live.store(false);
}

std::string strip_trailing_slashes(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  return path;
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

void AtomicDirWriter::check_absent_or_empty(const std::string& dir, const char* what,
                                            const char* force_flag) {
  std::error_code ec;
  const fs::file_status st = fs::status(dir, ec);
  if (!fs::exists(st)) return;
  KILN_CHECK_USAGE(fs::is_directory(st), "{} {}: exists and is not a directory", what, dir);
  const bool empty = fs::is_empty(dir, ec);
  KILN_CHECK(!ec, "{} {}: cannot read the directory: {}", what, dir, ec.message());
  KILN_CHECK_USAGE(empty,
                   "{} {}: the directory exists and is not empty; nothing was written (give {} "
                   "to replace it and everything in it)",
                   what, dir, force_flag);
}

AtomicDirWriter::AtomicDirWriter(std::string dir, Existing existing, const char* what,
                                 const char* force_flag)
    : dir_(strip_trailing_slashes(std::move(dir))),
      existing_(existing),
      what_(what),
      force_flag_(force_flag) {
  KILN_CHECK_USAGE(!dir_.empty(), "{}: the directory path is empty", what);
  const fs::path path(dir_);
  const std::string name = path.filename().string();
  KILN_CHECK_USAGE(!name.empty() && name != "." && name != "..",
                   "{} {}: give the directory to write by its name (a path ending in '.', '..' "
                   "or '/' names none)",
                   what, dir_);
  std::error_code ec;
  const fs::file_status st = fs::status(dir_, ec);
  KILN_CHECK_USAGE(!fs::exists(st) || fs::is_directory(st), "{} {}: exists and is not a directory",
                   what, dir_);
  if (existing_ == Existing::kRefuse) check_absent_or_empty(dir_, what, force_flag);
  const fs::path parent = path.parent_path();
  if (!parent.empty()) {
    fs::create_directories(parent, ec);
    KILN_CHECK(!ec, "{} {}: cannot create directory {}: {}", what, dir_, parent.string(),
               ec.message());
  }
  tmp_ = dir_ + ".partial." + std::to_string(getpid());
  fs::remove_all(tmp_, ec);  // left by a killed process that had this pid
  slot_ = track_partial_dir(tmp_);
  if (::mkdir(tmp_.c_str(), 0777) != 0) {
    const int error = errno;
    untrack_partial_dir(slot_);
    KILN_FAIL("{} {}: cannot create {}: {}", what, dir_, tmp_,
              std::generic_category().message(error));
  }
}

AtomicDirWriter::~AtomicDirWriter() {
  if (!committed_) {
    std::error_code ec;
    fs::remove_all(tmp_, ec);
  }
  untrack_partial_dir(slot_);
}

std::string AtomicDirWriter::path_of(const std::string& name) {
  KILN_CHECK(!name.empty() && name.find('/') == std::string::npos,
             "AtomicDirWriter: '{}' is not a plain file name", name);
  track_partial_name(slot_, name);
  return tmp_ + "/" + name;
}

void AtomicDirWriter::commit() {
  KILN_CHECK(!committed_, "commit of {} twice", dir_);
  // Into an absent or empty DIR, a plain rename; a non-empty DIR makes it fail (ENOTEMPTY or
  // EEXIST), which is how the loser of two concurrent writers finds out.
  if (::rename(tmp_.c_str(), dir_.c_str()) == 0) {
    committed_ = true;
    return;
  }
  const int error = errno;
  KILN_CHECK_USAGE(error != ENOTDIR, "{} {}: exists and is not a directory; nothing was written",
                   what_, dir_);
  KILN_CHECK(error == ENOTEMPTY || error == EEXIST, "cannot rename {} to {}: {}", tmp_, dir_,
             std::generic_category().message(error));
  switch (existing_) {
    case Existing::kRefuse:
      KILN_FAIL_KIND(ErrorKind::kUsage,
                     "{} {}: another process wrote the directory meanwhile; nothing was written "
                     "(give {} to replace it)",
                     what_, dir_, force_flag_);
    case Existing::kReplace:
      break;
  }
  // Swap in one step where the filesystem can; the old checkpoint is then at tmp_.
  std::string old = tmp_;
  if (::renameat2(AT_FDCWD, tmp_.c_str(), AT_FDCWD, dir_.c_str(), RENAME_EXCHANGE) != 0) {
    old = dir_ + ".replaced." + std::to_string(getpid());
    std::error_code ec;
    fs::remove_all(old, ec);
    if (::rename(dir_.c_str(), old.c_str()) != 0) {
      const int e = errno;
      KILN_FAIL("{} {}: cannot move the old directory aside to {}: {}", what_, dir_, old,
                std::generic_category().message(e));
    }
    if (::rename(tmp_.c_str(), dir_.c_str()) != 0) {
      const int e = errno;
      ::rename(old.c_str(), dir_.c_str());  // put the old one back
      KILN_FAIL("cannot rename {} to {}: {}", tmp_, dir_, std::generic_category().message(e));
    }
  }
  committed_ = true;
  std::error_code ec;
  fs::remove_all(old, ec);
  KILN_CHECK(!ec, "{} {}: written, but the replaced directory {} could not be removed: {}", what_,
             dir_, old, ec.message());
}

}  // namespace kiln
