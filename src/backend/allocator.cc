#include <sys/mman.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "backend/backend.h"

namespace kiln {
namespace {

#if defined(__SANITIZE_ADDRESS__)
constexpr bool kAddressSanitizer = true;
#else
constexpr bool kAddressSanitizer = false;
#endif

class HostAllocator final : public Allocator {
 public:
  Device device() const override { return Device::kCpu; }
  // Buffers of a huge page or more (a T5 request's cross K/V: 5.8 MB for flan-t5-base, read
  // whole by every decode step after the weights have streamed through the TLB; workspaces) in
  // 2 MB pages where the kernel grants them, asked for before the zeroing touches them. (In 4 KB
  // pages, flan-t5-base int8-weight's encoder arena cost 40 % of the time to first token in TLB
  // misses: 34 against 24 ms.) Buffers of kLazyBytes or more are anonymous mappings instead,
  // which the kernel fills with zeros page by page as they are first touched: a workspace sized
  // for the plan's largest step is then resident only as far as the steps that ran wrote it.
  // (Zeroed up front, bloom-560m's decoder arena, whose logits alone take 245 MiB at 256 rows of
  // 250,880, was all resident for a batch of one: peak memory 58 % above weights + KV cache for
  // the int8-weight plan, 5 % now.) Below that, a request's buffers come from the heap, whose
  // pages are reused (a mapping per request cost T5's time to first token its page faults).
  // Under AddressSanitizer all come from the heap, whose redzones catch a kernel writing past
  // its buffer.
  std::shared_ptr<void> allocate(size_t bytes) override {
    constexpr size_t kHugePage = size_t{2} << 20;
    constexpr size_t kLazyBytes = size_t{16} << 20;
    if (bytes >= kLazyBytes && !kAddressSanitizer) {
      const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
      // One huge page more, so that a 2 MB-aligned start lies inside; the rest is unmapped.
      const size_t span = rounded + kHugePage;
      void* raw = ::mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      KILN_CHECK(raw != MAP_FAILED, "out of memory allocating {} bytes of host memory", rounded);
      const uintptr_t start = reinterpret_cast<uintptr_t>(raw);
      const uintptr_t aligned = (start + kHugePage - 1) / kHugePage * kHugePage;
      if (aligned > start) ::munmap(raw, aligned - start);
      const size_t tail = start + span - (aligned + rounded);
      if (tail > 0) ::munmap(reinterpret_cast<void*>(aligned + rounded), tail);
      void* p = reinterpret_cast<void*>(aligned);
      ::madvise(p, rounded, MADV_HUGEPAGE);  // a hint
      return std::shared_ptr<void>(p, [rounded](void* q) { ::munmap(q, rounded); });
    }
    const size_t align = bytes >= kHugePage ? kHugePage : 64;
    const size_t rounded = std::max<size_t>((bytes + align - 1) / align * align, 64);
    void* p = std::aligned_alloc(align, rounded);
    KILN_CHECK(p != nullptr, "out of memory allocating {} bytes of host memory", rounded);
    if (align == kHugePage) ::madvise(p, rounded, MADV_HUGEPAGE);  // a hint
    std::memset(p, 0, rounded);
    return std::shared_ptr<void>(p, [](void* q) { std::free(q); });
  }
  Tensor upload(const Tensor& host) override { return host.clone(); }
};

}  // namespace

Tensor Allocator::tensor(DType dtype, const Shape& shape) {
  const size_t bytes = dtype_bytes(dtype, static_cast<size_t>(shape_numel(shape)));
  std::shared_ptr<void> memory = allocate(bytes);
  void* data = memory.get();
  return Tensor::view(dtype, shape, data, std::move(memory), device());
}

void Allocator::copy_to_host(const Tensor& t, void* dst) {
  KILN_CHECK(t.device() == Device::kCpu, "copy_to_host: this allocator reads host tensors only");
  std::memcpy(dst, t.raw(), t.nbytes());
}

namespace {

size_t padded(size_t bytes) { return (bytes + 63) / 64 * 64; }

// Copies of `parts` in one new buffer from `a` (host memory: written in place), each part at a
// 64-byte boundary.
std::vector<Tensor> pack_group(Allocator& a, std::span<const Tensor> parts) {
  size_t total = 0;
  for (const Tensor& t : parts) total += padded(t.nbytes());
  std::shared_ptr<void> memory = a.allocate(std::max<size_t>(total, 1));
  char* at = static_cast<char*>(memory.get());
  std::vector<Tensor> out;
  out.reserve(parts.size());
  for (const Tensor& t : parts) {
    a.copy_to_host(t, at);  // this allocator's memory is host memory
    out.push_back(Tensor::view(t.dtype(), t.shape(), at, memory, a.device()));
    at += padded(t.nbytes());
  }
  return out;
}

}  // namespace

std::vector<std::vector<Tensor>> Allocator::copy_groups(
    std::span<const std::vector<Tensor>> groups) {
  std::vector<std::vector<Tensor>> out;
  out.reserve(groups.size());
  for (const std::vector<Tensor>& group : groups) out.push_back(pack_group(*this, group));
  return out;
}

std::vector<std::vector<Tensor>> Allocator::copy_row_groups(std::span<const Tensor> sources,
                                                            std::span<const int64_t> row_bounds) {
  KILN_CHECK(!row_bounds.empty(), "copy_row_groups: no row bounds");
  std::vector<std::vector<Tensor>> groups(row_bounds.size() - 1);
  for (size_t g = 0; g + 1 < row_bounds.size(); ++g) {
    groups[g].reserve(sources.size());
    for (const Tensor& s : sources)
      groups[g].push_back(s.slice_rows(row_bounds[g], row_bounds[g + 1]));
  }
  return copy_groups(groups);
}

std::vector<std::vector<Tensor>> Allocator::copy_row_groups_as(std::span<const Tensor> sources,
                                                               std::span<const int64_t> row_bounds,
                                                               DType as) {
  bool same = true;
  for (const Tensor& s : sources) same = same && s.dtype() == as;
  if (same) return copy_row_groups(sources, row_bounds);
  KILN_CHECK(device() == Device::kCpu && as == DType::kBF16,
             "copy_row_groups_as: {} memory copies into {} only rows already of that type",
             device_name(device()), dtype_name(as));
  std::vector<Shape> row_shapes;
  for (const Tensor& s : sources) {
    KILN_CHECK(s.rank() >= 1, "copy_row_groups_as: a source has no rows");
    row_shapes.emplace_back(s.shape().begin() + 1, s.shape().end());
  }
  HostRowGroups groups(*this, std::move(row_shapes), row_bounds, as);
  for (size_t i = 0; i < sources.size(); ++i) groups.fill(i, sources[i]);
  return groups.take();
}

HostRowGroups::HostRowGroups(Allocator& allocator, std::vector<Shape> row_shapes,
                             std::span<const int64_t> row_bounds, DType as)
    : row_shapes_(std::move(row_shapes)), bounds_(row_bounds.begin(), row_bounds.end()), as_(as) {
  KILN_CHECK(allocator.device() == Device::kCpu, "HostRowGroups: fills host memory, not {}",
             device_name(allocator.device()));
  KILN_CHECK(!bounds_.empty() && bounds_.front() == 0, "HostRowGroups: row bounds must start at 0");
  for (size_t g = 0; g + 1 < bounds_.size(); ++g)
    KILN_CHECK(bounds_[g] <= bounds_[g + 1], "HostRowGroups: row bounds decrease at {}", g);
  for (const Shape& row : row_shapes_)
    row_bytes_.push_back(dtype_bytes(as_, static_cast<size_t>(shape_numel(row))));
  filled_.assign(row_shapes_.size(), false);
  for (size_t g = 0; g + 1 < bounds_.size(); ++g) {
    const size_t rows = static_cast<size_t>(bounds_[g + 1] - bounds_[g]);
    size_t total = 0;
    for (size_t p = 0; p < row_shapes_.size(); ++p) total += padded(rows * row_bytes_[p]);
    buffers_.push_back(allocator.allocate(std::max<size_t>(total, 1)));
  }
}

namespace {

// Where part `p` of a group of `rows` rows starts in its buffer.
size_t part_start(std::span<const size_t> row_bytes, size_t p, size_t rows) {
  size_t at = 0;
  for (size_t i = 0; i < p; ++i) at += padded(rows * row_bytes[i]);
  return at;
}

}  // namespace

void HostRowGroups::fill(size_t part, const Tensor& source) {
  KILN_CHECK(part < row_shapes_.size(), "HostRowGroups: part {} of {}", part, row_shapes_.size());
  Shape expect{std::max(bounds_.back(), source.rank() > 0 ? source.dim(0) : 0)};
  expect.insert(expect.end(), row_shapes_[part].begin(), row_shapes_[part].end());
  KILN_CHECK(source.device() == Device::kCpu && source.shape() == expect &&
                 (source.dtype() == as_ || source.dtype() == DType::kF32),
             "HostRowGroups: part {} takes host {} or f32 rows of shape {}, got {} {} on {}", part,
             dtype_name(as_), shape_str(expect), dtype_name(source.dtype()),
             shape_str(source.shape()), device_name(source.device()));
  const size_t elems = static_cast<size_t>(shape_numel(row_shapes_[part]));
  const size_t src_row = dtype_bytes(source.dtype(), elems);
  const char* from = static_cast<const char*>(source.raw());
  for (size_t g = 0; g + 1 < bounds_.size(); ++g) {
    const size_t rows = static_cast<size_t>(bounds_[g + 1] - bounds_[g]);
    char* to = static_cast<char*>(buffers_[g].get()) + part_start(row_bytes_, part, rows);
    const char* src = from + static_cast<size_t>(bounds_[g]) * src_row;
    if (source.dtype() == as_)
      std::memcpy(to, src, rows * src_row);
    else
      dtype_traits(as_).from_float(reinterpret_cast<const float*>(src), to, rows * elems);
  }
  filled_[part] = true;
}

std::vector<std::vector<Tensor>> HostRowGroups::take() {
  for (size_t p = 0; p < filled_.size(); ++p)
    KILN_CHECK(filled_[p], "HostRowGroups: part {} was never filled", p);
  std::vector<std::vector<Tensor>> out(buffers_.size());
  for (size_t g = 0; g + 1 < bounds_.size(); ++g) {
    const int64_t rows = bounds_[g + 1] - bounds_[g];
    for (size_t p = 0; p < row_shapes_.size(); ++p) {
      Shape shape{rows};
      shape.insert(shape.end(), row_shapes_[p].begin(), row_shapes_[p].end());
      char* at = static_cast<char*>(buffers_[g].get()) +
                 part_start(row_bytes_, p, static_cast<size_t>(rows));
      out[g].push_back(Tensor::view(as_, shape, at, buffers_[g], Device::kCpu));
    }
  }
  return out;
}

Allocator& host_allocator() {
  // Stateless: one shared instance is not mutable global state.
  static HostAllocator allocator;
  return allocator;
}

}  // namespace kiln
