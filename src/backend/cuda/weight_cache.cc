#include "backend/cuda/weight_cache.h"

#include <set>

namespace kiln::cuda {

WeightCache::WeightCache(CudaAllocator& allocator, cudaStream_t stream, int upload_threads,
                         int chunk_mib)
    : allocator_(allocator),
      stream_(stream),
      upload_threads_(upload_threads),
      chunk_mib_(chunk_mib) {}

Tensor WeightCache::device_weight(const Tensor& host) {
  if (host.device() == allocator_.device()) return host;
  auto it = weights_.find(host.raw());
  if (it != weights_.end() && it->second.first.nbytes() == host.nbytes() &&
      it->second.first.dtype() == host.dtype())
    return Tensor::view(host.dtype(), host.shape(), it->second.second.raw(),
                        std::make_shared<Tensor>(it->second.second), allocator_.device());
  Tensor device = allocator_.upload(host);
  weights_[host.raw()] = {host, device};
  return device;
}

UploadStats WeightCache::upload_weights(std::span<const Tensor> hosts) {
  std::vector<Tensor> todo;
  std::set<const void*> seen;
  for (const Tensor& h : hosts) {
    if (!h.defined() || h.device() == allocator_.device() || h.nbytes() == 0 || !h.is_contiguous())
      continue;
    if (weights_.count(h.raw()) > 0 || !seen.insert(h.raw()).second) continue;
    todo.push_back(h);
  }
  if (todo.empty() || upload_threads_ == 0) return {};
  const UploadLayout layout = plan_upload(todo);
  std::shared_ptr<void> memory = allocator_.allocate_raw(layout.device_bytes);
  // Cached memory may still be read by work queued on this context's stream.
  KILN_CUDA_CHECK(cudaStreamSynchronize(stream_));
  const UploadStats stats =
      run_upload(layout, memory.get(), upload_threads_, static_cast<size_t>(chunk_mib_) << 20);
  char* base = static_cast<char*>(memory.get());
  for (size_t i = 0; i < todo.size(); ++i)
    weights_[todo[i].raw()] = {
        todo[i], Tensor::view(todo[i].dtype(), todo[i].shape(), base + layout.device_offset[i],
                              memory, allocator_.device())};
  return stats;
}

Tensor WeightCache::filled_vector(DType dtype, int64_t n, float value) {
  Tensor& t = filled_[{dtype, n, value}];
  if (!t.defined())
    t = allocator_.upload(Tensor::from_vector(std::vector<float>(n, value), {n}).to(dtype));
  return t;
}

}  // namespace kiln::cuda
