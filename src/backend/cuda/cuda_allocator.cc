#include "backend/cuda/cuda_allocator.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <mutex>

#include "backend/cuda_info.h"

namespace kiln::cuda {

namespace {

// Device bytes that kiln's allocators hold (live blocks and their caches), and the most they held
// since cuda_memory_peak_reset(): the high-water mark between two readings of cudaMemGetInfo.
std::atomic<long long> g_held{0};
std::atomic<long long> g_peak_held{0};
// Of g_held: the libraries' fixed workspaces (cuBLASLt's, one per context).
std::atomic<long long> g_library_workspace{0};

void note_malloc(size_t bytes) {
  const long long held = g_held += static_cast<long long>(bytes);
  long long peak = g_peak_held.load();
  while (held > peak && !g_peak_held.compare_exchange_weak(peak, held)) {
  }
}

// The bytes a part of a copy_groups / copy_row_groups buffer takes: each starts 256-byte aligned.
size_t part_bytes(size_t bytes) { return (bytes + 255) / 256 * 256; }

void free_block(void* p, size_t bytes) {
  cudaFree(p);
  g_held -= static_cast<long long>(bytes);
}

}  // namespace

void* malloc_library_workspace(size_t bytes) {
  void* p = nullptr;
  KILN_CUDA_CHECK(cudaMalloc(&p, bytes));
  note_malloc(bytes);
  g_library_workspace += static_cast<long long>(bytes);
  return p;
}

void free_library_workspace(void* p, size_t bytes) {
  free_block(p, bytes);
  g_library_workspace -= static_cast<long long>(bytes);
}

struct CudaAllocator::Cache {
  std::mutex mutex;
  std::multimap<size_t, void*> free;  // by block size
  size_t bytes = 0;
  ~Cache() { release(); }
  void release() {
    for (auto& [size, p] : free) free_block(p, size);
    free.clear();
    bytes = 0;
  }
};

CudaAllocator::CudaAllocator(cudaStream_t stream, int ordinal)
    : stream_(stream), ordinal_(ordinal), cache_(std::make_shared<Cache>()) {}

size_t CudaAllocator::cached_bytes() const {
  std::lock_guard<std::mutex> lock(cache_->mutex);
  return cache_->bytes;
}

std::shared_ptr<void> CudaAllocator::allocate_raw(size_t bytes) {
  const size_t rounded = std::max<size_t>((bytes + 255) / 256 * 256, 256);
  std::shared_ptr<Cache> cache = cache_;
  void* p = nullptr;
  size_t size = rounded;
  {
    std::lock_guard<std::mutex> lock(cache->mutex);
    // The smallest cached block that fits, if it wastes at most half of itself.
    auto it = cache->free.lower_bound(rounded);
    if (it != cache->free.end() && it->first <= 2 * rounded) {
      size = it->first;
      p = it->second;
      cache->bytes -= size;
      cache->free.erase(it);
    }
  }
  if (p == nullptr) {
    cudaError_t err = cudaMalloc(&p, rounded);
    if (err == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      {
        std::lock_guard<std::mutex> lock(cache->mutex);
        cache->release();
      }
      err = cudaMalloc(&p, rounded);
    }
    if (err != cudaSuccess) {
      cudaGetLastError();
      size_t free_bytes = 0, total = 0;
      cudaMemGetInfo(&free_bytes, &total);
      KILN_FAIL("out of GPU memory allocating {} bytes ({} of {} bytes free): {}", rounded,
                free_bytes, total, cudaGetErrorString(err));
    }
    note_malloc(rounded);
  }
  return std::shared_ptr<void>(p, [cache, size](void* q) {
    if (size <= kMaxCachedBlock) {
      std::lock_guard<std::mutex> lock(cache->mutex);
      if (cache->bytes + size <= kMaxCachedBytes) {
        cache->free.emplace(size, q);
        cache->bytes += size;
        return;
      }
    }
    free_block(q, size);
  });
}

std::shared_ptr<void> CudaAllocator::allocate(size_t bytes) {
  std::shared_ptr<void> p = allocate_in_order(bytes);
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  return p;
}

std::shared_ptr<void> CudaAllocator::allocate_in_order(size_t bytes) {
  std::shared_ptr<void> p = allocate_raw(bytes);
  KILN_CUDA_CHECK(cudaMemsetAsync(p.get(), 0, std::max<size_t>(bytes, 1), stream_));
  return p;
}

Tensor CudaAllocator::upload(const Tensor& source) {
  KILN_CHECK(source.defined(), "cannot upload an undefined tensor to the GPU");
  const size_t bytes = source.nbytes();
  std::shared_ptr<void> memory = allocate_raw(std::max<size_t>(bytes, 1));
  Tensor t = Tensor::view(source.dtype(), source.shape(), memory.get(), memory, device());
  if (bytes > 0) {
    KILN_CUDA_CHECK(cudaMemcpyAsync(t.raw(), source.raw(), bytes, cudaMemcpyDefault, stream_));
    // A host source may be freed when this returns; a device one is read in stream order.
    if (source.device() != device()) KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  }
  return t;
}

std::vector<std::vector<Tensor>> CudaAllocator::copy_groups(
    std::span<const std::vector<Tensor>> groups) {
  std::vector<std::vector<Tensor>> out(groups.size());
  std::vector<CopyPart> parts;
  for (size_t g = 0; g < groups.size(); ++g) {
    size_t total = 0;
    for (const Tensor& t : groups[g]) total += part_bytes(t.nbytes());
    std::shared_ptr<void> memory = allocate_raw(std::max<size_t>(total, 1));
    char* at = static_cast<char*>(memory.get());
    for (const Tensor& t : groups[g]) {
      KILN_CHECK(t.defined(), "cannot copy an undefined tensor on the GPU");
      Tensor copy = Tensor::view(t.dtype(), t.shape(), at, memory, device());
      if (t.device() != device()) {
        KILN_CUDA_CHECK(cudaMemcpyAsync(at, t.raw(), t.nbytes(), cudaMemcpyHostToDevice, stream_));
        KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));  // the host source may go when we return
      } else if (t.nbytes() > 0) {
        parts.push_back({t.raw(), at, static_cast<long long>(t.nbytes())});
      }
      out[g].push_back(std::move(copy));
      at += part_bytes(t.nbytes());
    }
  }
  copy_parts(parts);
  return out;
}

void CudaAllocator::copy_parts(std::span<const CopyPart> parts) {
  if (parts.empty()) return;
  // The part list goes to the device from pageable memory: cudaMemcpyAsync has staged it when it
  // returns, so `parts` may go; the list's device buffer returns to the cache when this returns,
  // and anything reusing it runs after the launch in stream order.
  std::shared_ptr<void> list = allocate_raw(parts.size() * sizeof(CopyPart));
  KILN_CUDA_CHECK(cudaMemcpyAsync(list.get(), parts.data(), parts.size() * sizeof(CopyPart),
                                  cudaMemcpyHostToDevice, stream_));
  launch_copy_parts(static_cast<const CopyPart*>(list.get()), static_cast<int64_t>(parts.size()),
                    stream_);
  KILN_CUDA_CHECK(cudaGetLastError());
}

std::vector<std::vector<Tensor>> CudaAllocator::copy_row_groups(
    std::span<const Tensor> sources, std::span<const int64_t> row_bounds) {
  KILN_CHECK(!row_bounds.empty(), "copy_row_groups: no row bounds");
  const size_t groups = row_bounds.size() - 1;
  for (const Tensor& s : sources)
    if (!s.defined() || s.device() != Device::kCuda || s.rank() < 1 || !s.is_contiguous() ||
        row_bounds.front() < 0 || row_bounds.back() > s.dim(0))
      return Allocator::copy_row_groups(sources, row_bounds);  // slices, checked there
  std::vector<size_t> row_bytes(sources.size());
  for (size_t s = 0; s < sources.size(); ++s)
    row_bytes[s] = sources[s].dim(0) == 0 ? 0 : sources[s].nbytes() / sources[s].dim(0);
  std::vector<std::vector<Tensor>> out(groups);
  std::vector<CopyPart> parts;
  parts.reserve(groups * sources.size());
  for (size_t g = 0; g < groups; ++g) {
    const int64_t begin = row_bounds[g], rows = row_bounds[g + 1] - begin;
    KILN_CHECK(rows >= 0, "copy_row_groups: row bounds {} > {}", begin, row_bounds[g + 1]);
    size_t total = 0;
    for (size_t s = 0; s < sources.size(); ++s) total += part_bytes(row_bytes[s] * rows);
    std::shared_ptr<void> memory = allocate_raw(std::max<size_t>(total, 1));
    const Tensor buffer =
        Tensor::view(DType::kI8, {static_cast<int64_t>(std::max<size_t>(total, 1))}, memory.get(),
                     memory, device());
    out[g].reserve(sources.size());
    size_t at = 0;
    for (size_t s = 0; s < sources.size(); ++s) {
      Shape shape = sources[s].shape();
      shape[0] = rows;
      const size_t bytes = row_bytes[s] * static_cast<size_t>(rows);
      out[g].push_back(buffer.view_at(sources[s].dtype(), std::move(shape), at));
      if (bytes > 0)
        parts.push_back({static_cast<const char*>(sources[s].raw()) + row_bytes[s] * begin,
                         static_cast<char*>(memory.get()) + at, static_cast<long long>(bytes)});
      at += part_bytes(bytes);
    }
  }
  copy_parts(parts);
  return out;
}

Tensor CudaAllocator::to_host(const Tensor& t) {
  if (t.device() == Device::kCpu) return t.clone();
  Tensor host = Tensor::empty(t.dtype(), t.shape());
  if (t.nbytes() > 0) {
    KILN_CUDA_CHECK(
        cudaMemcpyAsync(host.raw(), t.raw(), t.nbytes(), cudaMemcpyDeviceToHost, stream_));
    KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
    if (after_read_) after_read_();
  }
  return host;
}

void CudaAllocator::copy_to_host(const Tensor& t, void* dst) {
  if (t.device() == Device::kCpu) {
    std::memcpy(dst, t.raw(), t.nbytes());
    return;
  }
  if (t.nbytes() == 0) return;
  KILN_CUDA_CHECK(cudaMemcpyAsync(dst, t.raw(), t.nbytes(), cudaMemcpyDeviceToHost, stream_));
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  if (after_read_) after_read_();
}

}  // namespace kiln::cuda

namespace kiln {

void cuda_memory_peak_reset() { cuda::g_peak_held = cuda::g_held.load(); }

long long cuda_memory_held_bytes() { return cuda::g_held.load(); }

long long cuda_library_workspace_bytes() { return cuda::g_library_workspace.load(); }

long long cuda_memory_peak_bytes() {
  const long long now = cuda_memory_used_bytes();
  if (now < 0) return now;
  return now + std::max(0LL, cuda::g_peak_held.load() - cuda::g_held.load());
}

}  // namespace kiln
