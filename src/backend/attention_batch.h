// What attention kernels need to know about a step's batch: where each sequence's tokens are in
// the ragged activations, how long its cached past is, its paged-KV block table and its cross
// K/V. This is a layout, not a request: nothing here knows about prompts or sampling.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/tensor.h"

namespace kiln {

// Paged K/V storage seen by kernels. A block holds `block_size` positions of one layer's keys
// (or values), each position a row of num_heads * head_dim floats.
class KvBlockStore {
 public:
  virtual ~KvBlockStore() = default;
  virtual int block_size() const = 0;
  virtual int64_t row_width() const = 0;  // num_heads * head_dim
  virtual float* key_block(int layer, int32_t block) = 0;
  virtual float* value_block(int layer, int32_t block) = 0;
};

struct CrossKv {
  std::vector<Tensor> keys;    // per decoder layer: [enc_len, H*dh] f32
  std::vector<Tensor> values;  // per decoder layer: [enc_len, H*dh] f32
  int64_t length() const { return keys.empty() ? 0 : keys[0].dim(0); }
};

struct SequenceSlot {
  int64_t token_begin = 0;  // first row of this sequence in the step's activations
  int64_t num_tokens = 0;   // rows this step (prompt length at prefill, 1 when decoding)
  int64_t past_len = 0;     // positions already in the cache; new tokens start here
  // Block table for cached self attention: covers past_len + num_tokens positions, and no block
  // written this step is shared with another sequence (the runtime copies on write first).
  std::span<const int32_t> blocks;
  const CrossKv* cross = nullptr;  // cross attention only
};

struct AttentionBatch {
  std::vector<SequenceSlot> seqs;
  KvBlockStore* cache = nullptr;
  int64_t total_tokens() const {
    int64_t n = 0;
    for (const SequenceSlot& s : seqs) n += s.num_tokens;
    return n;
  }
};

}  // namespace kiln
