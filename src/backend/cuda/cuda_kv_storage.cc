#include "backend/cuda/cuda_kv_storage.h"

namespace kiln::cuda {

CudaKvStorage::CudaKvStorage(CudaContext& ctx, const KvGeometry& g) : ctx_(ctx), geometry_(g) {
  KILN_CHECK(g.layers > 0 && g.row_width > 0 && g.block_size > 0,
             "invalid KV cache geometry: {} layers, row width {}, block size {}", g.layers,
             g.row_width, g.block_size);
  // f32, f16, bf16 (the attention's own type) or E4M3 (--kv-cache fp8).
  KILN_CHECK(g.dtype == DType::kF8E4M3 || g.dtype == DType::kF32 || g.dtype == DType::kF16 ||
                 g.dtype == DType::kBF16,
             "the cuda KV cache holds f32, f16, bf16 or f8_e4m3 keys and values, not {}",
             dtype_name(g.dtype));
}

int64_t CudaKvStorage::layer_bytes() const {
  return static_cast<int64_t>(dtype_bytes(
      geometry_.dtype, static_cast<size_t>(geometry_.block_size * geometry_.row_width)));
}

void CudaKvStorage::resize(int64_t blocks) {
  KILN_CHECK(blocks >= 0, "negative KV cache size {}", blocks);
  const size_t chunks = static_cast<size_t>((blocks + kBlocksPerChunk - 1) / kBlocksPerChunk);
  if (chunks == chunks_.size()) return;
  // Growing does not wait for the GPU: the new chunks are zeroed and the table written in the
  // stream's order (a pageable upload returns once its source is staged), and the old table goes
  // back to the allocator, whose blocks only later work on the stream reuses. So a prompt's
  // first decode step is prepared while the step before it (a batch's encoder) still runs.
  // Shrinking waits: kernels of an earlier step may still read the chunks being freed.
  if (chunks < chunks_.size()) KILN_CUDA_CHECK(cudaStreamSynchronize(ctx_.stream()));
  while (chunks_.size() > chunks) chunks_.pop_back();
  while (chunks_.size() < chunks)
    chunks_.push_back(ctx_.allocator().allocate_in_order(
        static_cast<size_t>(kBlocksPerChunk * geometry_.block_bytes())));
  std::vector<char*> table(static_cast<size_t>(capacity()));
  for (int64_t b = 0; b < capacity(); ++b) table[b] = base(static_cast<int32_t>(b));
  table_ =
      table.empty() ? nullptr : ctx_.allocator().allocate_in_order(table.size() * sizeof(char*));
  if (!table.empty())
    KILN_CUDA_CHECK(cudaMemcpyAsync(table_.get(), table.data(), table.size() * sizeof(char*),
                                    cudaMemcpyHostToDevice, ctx_.stream()));
}

void CudaKvStorage::copy_blocks(std::span<const BlockCopy> copies) {
  for (const BlockCopy& c : copies)
    KILN_CUDA_CHECK(cudaMemcpyAsync(base(c.dst), base(c.src),
                                    static_cast<size_t>(geometry_.block_bytes()),
                                    cudaMemcpyDeviceToDevice, ctx_.stream()));
}

char* CudaKvStorage::base(int32_t block) const {
  KILN_CHECK(block >= 0 && block < capacity(), "KV block {} does not exist (capacity {})", block,
             capacity());
  return static_cast<char*>(chunks_[block / kBlocksPerChunk].get()) +
         (block % kBlocksPerChunk) * geometry_.block_bytes();
}

void* CudaKvStorage::key_block(int layer, int32_t block) {
  KILN_CHECK(layer >= 0 && layer < geometry_.layers, "KV layer {} does not exist ({} layers)",
             layer, geometry_.layers);
  return base(block) + 2 * layer * layer_bytes();
}

void* CudaKvStorage::value_block(int layer, int32_t block) {
  KILN_CHECK(layer >= 0 && layer < geometry_.layers, "KV layer {} does not exist ({} layers)",
             layer, geometry_.layers);
  return base(block) + (2 * layer + 1) * layer_bytes();
}

DeviceKv CudaKvStorage::device_view() const {
  DeviceKv v{};
  v.block_base = static_cast<char* const*>(table_.get());
  v.capacity = capacity();
  v.block_size = geometry_.block_size;
  v.row_width = geometry_.row_width;
  v.layer_bytes = layer_bytes();
  v.fp8 = geometry_.dtype == DType::kF8E4M3;
  return v;
}

}  // namespace kiln::cuda
