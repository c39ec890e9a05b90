#include "io/weight_spill.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "core/status.h"

namespace kiln {
namespace {

thread_local std::shared_ptr<WeightSpill> g_active;

size_t page_size() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

}  // namespace

std::shared_ptr<WeightSpill> WeightSpill::create(const std::string& dir, size_t min_bytes) {
  std::shared_ptr<WeightSpill> s(new WeightSpill());
  s->dir_ = dir;
  s->min_bytes_ = min_bytes;
  s->fd_ = ::open(dir.c_str(), O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
  if (s->fd_ < 0) {
    // Filesystems without O_TMPFILE: a named file, unlinked at once.
    std::string path = dir + "/kiln-build-weights.XXXXXX";
    s->fd_ = ::mkostemp(path.data(), O_CLOEXEC);
    if (s->fd_ >= 0) ::unlink(path.c_str());
  }
  KILN_CHECK(s->fd_ >= 0,
             "cannot create the build's weight file in {}: {} (the build keeps the weights it "
             "makes in a temporary file in the plan's folder: write the plan where files can be "
             "created)",
             dir, std::strerror(errno));
  return s;
}

WeightSpill::~WeightSpill() {
  if (fd_ >= 0) ::close(fd_);
}

Tensor WeightSpill::put(Tensor t) {
  const size_t bytes = t.nbytes();
  if (!t.defined() || !t.owns_memory() || t.device() != Device::kCpu || bytes < min_bytes_ ||
      bytes == 0 || !t.is_contiguous())
    return t;
  const uint64_t offset = end_;
  const char* src = static_cast<const char*>(t.raw());
  for (size_t done = 0; done < bytes;) {
    const ssize_t n = ::pwrite(fd_, src + done, bytes - done, static_cast<off_t>(offset + done));
    if (n < 0 && errno == EINTR) continue;
    KILN_CHECK(n > 0,
               "writing the build's weights to a temporary file in {}: {} (the plan's folder "
               "needs room for about the plan twice while it is built)",
               dir_, n < 0 ? std::strerror(errno) : "no space left");
    done += static_cast<size_t>(n);
  }
  const size_t span = (bytes + page_size() - 1) / page_size() * page_size();
  end_ += span;
  written_ += static_cast<int64_t>(bytes);
  void* p = ::mmap(nullptr, span, PROT_READ, MAP_SHARED, fd_, static_cast<off_t>(offset));
  KILN_CHECK(p != MAP_FAILED, "mapping the build's temporary weight file: {}",
             std::strerror(errno));
  // The mapping lives as long as any tensor viewing it; then its range of the file is freed.
  std::shared_ptr<void> owner(p, [self = shared_from_this(), offset, span](void* q) {
    ::munmap(q, span);
    self->release(offset, span);
  });
  Tensor out = Tensor::mapped(t.dtype(), t.shape(), p, std::move(owner));
  t = Tensor();  // the memory goes now, not when the caller's copy does
  return out;
}

void WeightSpill::release(uint64_t offset, size_t bytes) {
  // A hole: the disk space comes back (best effort: filesystems without it keep the bytes until
  // the file closes).
  ::fallocate(fd_, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, static_cast<off_t>(offset),
              static_cast<off_t>(bytes));
}

WeightSpill::Scope::Scope(std::shared_ptr<WeightSpill> spill) : previous_(std::move(g_active)) {
  g_active = std::move(spill);
}

WeightSpill::Scope::~Scope() { g_active = std::move(previous_); }

WeightSpill* WeightSpill::active() { return g_active.get(); }

}  // namespace kiln
