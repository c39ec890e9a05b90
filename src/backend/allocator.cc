#include <sys/mman.h>

#include <cstdlib>
#include <cstring>

#include "backend/backend.h"
#include "core/half.h"

namespace kiln {
namespace {

class HostAllocator final : public Allocator {
 public:
  Device device() const override { return Device::kCpu; }
  // Buffers of a huge page or more (a T5 request's cross K/V: 5.8 MB for flan-t5-base, read
  // whole by every decode step after the weights have streamed through the TLB; workspaces) in
  // 2 MB pages where the kernel grants them, asked for before the zeroing touches them. (No
  // measurable change at batch 1 on this VM, where the weights stay in 4 KB pages of the plan's
  // mapping; kept as the KV cache's chunks are.)
  std::shared_ptr<void> allocate(size_t bytes) override {
    constexpr size_t kHugePage = size_t{2} << 20;
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

std::vector<std::vector<Tensor>> Allocator::copy_groups(
    std::span<const std::vector<Tensor>> groups) {
  std::vector<std::vector<Tensor>> out(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    size_t total = 0;
    for (const Tensor& t : groups[g]) total += (t.nbytes() + 63) / 64 * 64;
    std::shared_ptr<void> memory = allocate(std::max<size_t>(total, 1));
    char* at = static_cast<char*>(memory.get());
    for (const Tensor& t : groups[g]) {
      Tensor copy = Tensor::view(t.dtype(), t.shape(), at, memory, device());
      copy_to_host(t, at);  // this allocator's memory is host memory
      out[g].push_back(std::move(copy));
      at += (t.nbytes() + 63) / 64 * 64;
    }
  }
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
  std::vector<std::vector<Tensor>> out(row_bounds.size() - 1);
  for (size_t g = 0; g + 1 < row_bounds.size(); ++g) {
    size_t total = 0;
    std::vector<Tensor> parts;
    for (const Tensor& s : sources) {
      KILN_CHECK(s.dtype() == DType::kF32 && s.device() == Device::kCpu,
                 "copy_row_groups_as: rounds host f32 rows to bf16, not {} rows on {}",
                 dtype_name(s.dtype()), device_name(s.device()));
      parts.push_back(s.slice_rows(row_bounds[g], row_bounds[g + 1]));
      total += (dtype_bytes(as, static_cast<size_t>(parts.back().numel())) + 63) / 64 * 64;
    }
    std::shared_ptr<void> memory = allocate(std::max<size_t>(total, 1));
    char* at = static_cast<char*>(memory.get());
    for (const Tensor& part : parts) {
      const float* src = part.data<float>();
      uint16_t* dst = reinterpret_cast<uint16_t*>(at);
      const int64_t n = part.numel();
      for (int64_t i = 0; i < n; ++i) dst[i] = float_to_bf16(src[i]);
      out[g].push_back(Tensor::view(as, part.shape(), at, memory, device()));
      at += (dtype_bytes(as, static_cast<size_t>(n)) + 63) / 64 * 64;
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
