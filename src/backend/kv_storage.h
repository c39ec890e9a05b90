// Memory the backend owns for generation state: the paged self-attention KV cache and the
// per-request cross-attention K/V. The runtime decides which block each position goes to (an
// integer block manager); the backend decides where blocks live (host or device memory) and in
// which dtype. Kernels reach blocks through key_block()/value_block().
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"

namespace kiln {

// One block holds `block_size` positions of one layer's keys (or values), each position a row of
// row_width = num_heads * head_dim elements of `dtype`.
struct KvGeometry {
  int layers = 0;
  int64_t row_width = 0;
  int block_size = 16;
  DType dtype = DType::kF32;
  // Bytes of one block across every layer, keys and values.
  int64_t block_bytes() const {
    return static_cast<int64_t>(layers) * 2 * block_size *
           static_cast<int64_t>(dtype_bytes(dtype, static_cast<size_t>(row_width)));
  }
};

struct BlockCopy {
  int32_t src = 0;
  int32_t dst = 0;
};

class KvStorage {
 public:
  virtual ~KvStorage() = default;
  virtual const KvGeometry& geometry() const = 0;
  virtual Device device() const = 0;
  // Blocks that exist now. Storage grows in chunks, so this may exceed what was asked for.
  virtual int64_t capacity() const = 0;
  // Grows or shrinks to hold at least `blocks` blocks (rounded up to whole chunks). Existing
  // blocks below the new capacity keep their contents and addresses; the caller guarantees
  // that no block at or above the new capacity is in use when shrinking.
  virtual void resize(int64_t blocks) = 0;
  virtual int64_t bytes_allocated() const = 0;
  // Copies every layer of each src block into its dst block (copy on write for beams).
  virtual void copy_blocks(std::span<const BlockCopy> copies) = 0;
  // The first element of a block of one layer, in the storage's device memory.
  virtual void* key_block(int layer, int32_t block) = 0;
  virtual void* value_block(int layer, int32_t block) = 0;
};

// A request's cross-attention keys and values (encoder-decoder models): computed once from the
// encoder output, shared by every beam, holding only this request's rows.
struct CrossKv {
  std::vector<Tensor> keys;    // per decoder layer: [enc_len, H*dh]
  std::vector<Tensor> values;  // per decoder layer: [enc_len, H*dh]
  int64_t length() const { return keys.empty() ? 0 : keys[0].dim(0); }
};

}  // namespace kiln
