#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <optional>

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
// 64-byte boundary and of type `as` (f32 parts converted through the dtype table), or of its own
// type when `as` is empty.
std::vector<Tensor> pack_group(Allocator& a, std::span<const Tensor> parts,
                               std::optional<DType> as) {
  const auto type_of = [&](const Tensor& t) { return as.value_or(t.dtype()); };
  size_t total = 0;
  for (const Tensor& t : parts)
    total += padded(dtype_bytes(type_of(t), static_cast<size_t>(t.numel())));
  std::shared_ptr<void> memory = a.allocate(std::max<size_t>(total, 1));
  char* at = static_cast<char*>(memory.get());
  std::vector<Tensor> out;
  out.reserve(parts.size());
  for (const Tensor& t : parts) {
    const DType type = type_of(t);
    if (type == t.dtype())
      a.copy_to_host(t, at);  // this allocator's memory is host memory
    else
      dtype_traits(type).from_float(t.data<float>(), at, static_cast<size_t>(t.numel()));
    out.push_back(Tensor::view(type, t.shape(), at, memory, a.device()));
    at += padded(dtype_bytes(type, static_cast<size_t>(t.numel())));
  }
  return out;
}

}  // namespace

std::vector<std::vector<Tensor>> Allocator::copy_groups(
    std::span<const std::vector<Tensor>> groups) {
  std::vector<std::vector<Tensor>> out;
  out.reserve(groups.size());
  for (const std::vector<Tensor>& group : groups) out.push_back(pack_group(*this, group, {}));
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
  KILN_CHECK(!row_bounds.empty(), "copy_row_groups_as: no row bounds");
  for (const Tensor& s : sources)
    KILN_CHECK(s.dtype() == DType::kF32 && s.device() == Device::kCpu,
               "copy_row_groups_as: rounds host f32 rows to bf16, not {} rows on {}",
               dtype_name(s.dtype()), device_name(s.device()));
  std::vector<std::vector<Tensor>> out;
  out.reserve(row_bounds.size() - 1);
  std::vector<Tensor> parts(sources.size());
  for (size_t g = 0; g + 1 < row_bounds.size(); ++g) {
    for (size_t i = 0; i < sources.size(); ++i)
      parts[i] = sources[i].slice_rows(row_bounds[g], row_bounds[g + 1]);
    out.push_back(pack_group(*this, parts, as));
  }
  return out;
}

Allocator& host_allocator() {
  // Stateless: one shared instance is not mutable global state.
  static HostAllocator allocator;
  return allocator;
}

}  // namespace kiln
