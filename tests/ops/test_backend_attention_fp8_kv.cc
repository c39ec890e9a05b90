// Cached self attention over an fp8 KV cache (`kiln build --kv-cache fp8`, CUDA) against the
// reference backend, which stores each key and value as E4M3 (scale 1, saturating at ±448) and
// reads it back by the definition: every CUDA variant (the row kernel, the tiled prompt kernel
// at 64 and 32 rows, replayed graphs and eager launches), fp16, bf16 and fp32 activations, on
// the cached scenarios of the op table: prefill then decode with the batch order changing, beams
// sharing a prefix (copy on write of fp8 blocks), chunked prompts over cached keys (head_dim 64:
// the tiled kernel widening cached codes and rounding the step's own rows), and decode over 1,500
// positions (split along the keys). The reference holds the same E4M3 values, so the outputs
// differ only by the sums' rounding: the activation type's tolerance. Skipped without a GPU.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "attention_scenarios.h"
#include "backend_ops.h"
#include "core/half.h"

namespace kiln::test {
namespace {

struct Fp8KvCase {
  std::string name;
  AttnConfig config;
  std::vector<CachedStep> steps;
};

std::vector<Fp8KvCase> fp8_kv_cases() {
  AttnConfig alibi64 = alibi_cached_packed();
  alibi64.heads = 3;
  alibi64.head_dim = 64;
  AttnConfig t5_64 = t5_cached();
  t5_64.heads = 2;
  t5_64.head_dim = 64;
  t5_64.block_size = 4;
  return {
      {"alibi_packed_prefill_then_decode", alibi_cached_packed(), kPrefillThenDecode},
      {"t5_prefill_then_decode", t5_cached(), kPrefillThenDecode},
      {"alibi_shared_prefix_copy_on_write", alibi_cached_packed(), kSharedPrefix},
      {"alibi_dh64_chunked_prompts",
       alibi64,
       {{{}, {{0, 70}, {1, 20}}}, {{}, {{1, 50}, {0, 40}}}, {{}, {{0, 1}, {1, 1}}}}},
      {"t5_dh64_chunked_prompts_block4",
       t5_64,
       {{{}, {{0, 100}}}, {{}, {{0, 30}, {1, 65}}}, {{}, {{1, 1}, {0, 1}}}}},
      {"alibi_long_context_decode",
       alibi_cached_packed(),
       {{{}, {{0, 800}}}, {{}, {{0, 700}}}, {{}, {{0, 1}}}, {{}, {{0, 1}, {1, 300}}}}},
  };
}

TEST(BackendOps, CudaFp8KvCacheMatchesReference) {
  const std::unique_ptr<Backend> reference = reference_backend();
  std::vector<NamedBackend> backends = available_backends();
  int compared = 0;
  uint32_t seed = 4100;
  for (const Fp8KvCase& c : fp8_kv_cases())
    for (DType dtype : {DType::kF16, DType::kBF16, DType::kF32}) {
      Gen g(dtype, dtype, ++seed);
      Scenario sc = cached_scenario(g, c.config, c.steps);
      sc.kv->dtype = DType::kF8E4M3;
      const ScenarioOutputs want = run_scenario(*reference, sc);
      // fp32 sums over 1,500 keys: 3e-5 of the largest output (as the op table's long decode).
      const Check check{CheckKind::kMaxRelative, dtype == DType::kF32 ? 3e-5 : 0.0};
      for (NamedBackend& nb : backends) {
        if (!nb.name.starts_with("cuda")) continue;
        const ScenarioOutputs got = run_scenario(*nb.backend, sc);
        ASSERT_EQ(got.size(), want.size());
        for (size_t step = 0; step < want.size(); ++step)
          expect_matches(got[step][0], want[step][0], check,
                         nb.name + " fp8 KV " + c.name + dtype_suffix(dtype) + " step " +
                             std::to_string(step));
        ++compared;
      }
    }
  if (compared == 0) GTEST_SKIP() << "no backend here keeps an fp8 KV cache (no GPU)";
}

// The reference's fp8 cache itself: keys and values past E4M3's range saturate (±448) instead of
// becoming infinities, so attention over them stays finite; and a cache of E4M3 values holds them
// exactly (the same outputs as an fp16 cache when every K/V element is an E4M3 value).
TEST(BackendOps, ReferenceFp8KvCacheRoundsByTheDefinition) {
  const std::unique_ptr<Backend> reference = reference_backend();
  AttnConfig c = alibi_cached_packed();
  // Values that E4M3 holds exactly: multiples of 1/4 in [-2, 2) have at most 3 significant
  // bits (E4M3 keeps 4).
  Gen g(DType::kF16, DType::kF16, 99);
  Scenario sc = cached_scenario(g, c, kPrefillThenDecode);
  for (ScenarioStep& st : sc.steps)
    for (auto& [name, t] : st.feed) {
      if (t.dtype() != DType::kF16) continue;
      auto* h = static_cast<uint16_t*>(t.raw());
      for (int64_t i = 0; i < t.numel(); ++i) {
        const float v = std::round(fp16_to_float(h[i]) * 4.0f) / 4.0f;
        h[i] = float_to_fp16(std::min(std::max(v, -2.0f), 1.75f));
      }
    }
  const ScenarioOutputs f16_cache = run_scenario(*reference, sc);
  sc.kv->dtype = DType::kF8E4M3;
  const ScenarioOutputs f8_cache = run_scenario(*reference, sc);
  for (size_t step = 0; step < f16_cache.size(); ++step)
    expect_matches(f8_cache[step][0], f16_cache[step][0], Check{CheckKind::kExact},
                   "E4M3-exact K/V, step " + std::to_string(step));
  // Saturation: K/V scaled past 448 (up to 2,048) stay finite.
  for (ScenarioStep& st : sc.steps)
    for (auto& [name, t] : st.feed) {
      if (t.dtype() != DType::kF16) continue;
      auto* h = static_cast<uint16_t*>(t.raw());
      for (int64_t i = 0; i < t.numel(); ++i) h[i] = float_to_fp16(fp16_to_float(h[i]) * 1024.0f);
    }
  const ScenarioOutputs big = run_scenario(*reference, sc);
  for (const auto& step : big) {
    const auto* y = static_cast<const uint16_t*>(step[0].raw());
    for (int64_t i = 0; i < step[0].numel(); ++i)
      ASSERT_TRUE(std::isfinite(fp16_to_float(y[i]))) << i;
  }
}

}  // namespace
}  // namespace kiln::test
