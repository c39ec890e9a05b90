// The position-bias math of the models' attention, exactly as HuggingFace computes it.
#pragma once

#include <cstdint>
#include <vector>

namespace kiln {

// T5's _relative_position_bucket for relative_position = key_pos - query_pos, in the same float32
// arithmetic as the PyTorch code (log of float, truncation toward zero, clamp to the last bucket).
int t5_relative_bucket(int64_t relative_position, bool bidirectional, int num_buckets,
                       int max_distance);

// BLOOM's ALiBi slopes, including the interleaved extra slopes when num_heads is not a power of 2.
std::vector<float> alibi_slopes(int num_heads);

}  // namespace kiln
