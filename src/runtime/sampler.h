// Token choice from one row of logits: greedy argmax, and sampling with temperature, top-k and
// top-p (HF's warper order: temperature, top-k, top-p), reproducible for a given RNG state.
#pragma once

#include <cstdint>
#include <random>
#include <span>
#include <vector>

#include "kiln/generate.h"

namespace kiln {

// First index of the maximum, like torch.argmax.
int64_t argmax(std::span<const float> logits);
int64_t sample_token(std::span<const float> logits, const GenerationParams& params,
                     std::mt19937_64& rng);
// The same draw from a row's best candidates, already divided by the temperature and in the
// order sample_token sorts them (descending, ties to the lower id): at least top_k of them when
// top_k > 0, else the whole row. What a TokenSelector's top_k_rows returns.
int64_t sample_sorted(std::span<const float> scaled, std::span<const int64_t> ids,
                      const GenerationParams& params, std::mt19937_64& rng);
// The seed of request `index` of a run seeded with `seed` (splitmix64 of the pair): requests
// get unrelated streams, so identical prompts sample differently, and a run repeats exactly.
uint64_t derive_seed(uint64_t seed, uint64_t index);
// log_softmax in fp32.
void log_softmax(std::span<const float> logits, std::vector<float>* out);

}  // namespace kiln
