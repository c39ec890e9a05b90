// A CUDA context's weights: the device copy of each host weight, uploaded once per backend
// (graphs that share a weight share the copy), in one bulk copy for a plan (weight_upload.h)
// or one by one, and the shared constant vectors folded norms read.
#pragma once

#include <map>
#include <span>
#include <tuple>
#include <utility>

#include "backend/cuda/cuda_allocator.h"
#include "backend/cuda/weight_upload.h"

namespace kiln::cuda {

class WeightCache {
 public:
  // `upload_threads` and `chunk_mib`: KILN_CUDA_UPLOAD_THREADS and KILN_CUDA_UPLOAD_CHUNK_MB.
  WeightCache(CudaAllocator& allocator, cudaStream_t stream, int upload_threads, int chunk_mib);

  // The device copy of a weight (uploaded now when it has none yet).
  Tensor device_weight(const Tensor& host);
  // Uploads the host weights that have no device copy yet in one bulk copy (one allocation,
  // parallel staged chunks, no per-tensor wait); device_weight finds them. With 0 upload
  // threads nothing is done here: each weight is uploaded alone when first used.
  UploadStats upload_weights(std::span<const Tensor> hosts);
  // A device vector of n copies of `value` in `dtype`, made once per (dtype, n, value) and
  // shared (the norm kernel's unit weight and zero bias for folded norms).
  Tensor filled_vector(DType dtype, int64_t n, float value);

 private:
  CudaAllocator& allocator_;
  cudaStream_t stream_;
  int upload_threads_;
  int chunk_mib_;
  // Keyed by the host bytes; the host tensor is kept so that its address is not reused.
  std::map<const void*, std::pair<Tensor, Tensor>> weights_;
  std::map<std::tuple<DType, int64_t, float>, Tensor> filled_;
};

}  // namespace kiln::cuda
